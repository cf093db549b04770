"""LoRA adapters on the vision tower, in the engine: an adapter made by peft on the tower's
linear layers as well as the decoder's is exact against transformers with it merged (greedy
float32), cold and on a repeat; the same image is encoded once for the base model and a
language-only adapter together, and once more for the tower adapter, whose embeddings are its
own (an mm_hash of their own: shared/hashing.py mm_hash_for_adapter)."""

from __future__ import annotations

import pytest
import torch

from services.engine.config import EngineConfig
from services.engine.llm import LLM
from services.engine.sampling_params import SamplingParams
from shared.hashing import mm_hash_for_adapter
from tests.factories import chat_case, encode_image, make_image
from tests.oracle import ReferenceOracle, assert_tokens_match
from tests.peft_adapters import TOWER_TARGETS, make_adapter, merged_model

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)
FAMILIES = ["tiny", "qwen3vl-tiny", "gemma3-tiny"]  # Qwen3.5's tower is Qwen3-VL's


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request):
    from services.models.registry import resolve_model

    return resolve_model(request.param, progress=lambda _m: None)


def _oracle(model, adapter_dir=None) -> ReferenceOracle:
    if adapter_dir is None:
        return ReferenceOracle(model.path)
    oracle = ReferenceOracle(model.path, load_model=False)
    oracle.model = merged_model(model.path, adapter_dir)
    return oracle


def test_a_tower_adapter_is_exact_and_encodes_an_image_once_per_tower_adapter(family_model, tmp_path):
    paths = {
        "tower": make_adapter(family_model.path, tmp_path / "tower", seed=3, targets=TOWER_TARGETS),
        "language": make_adapter(family_model.path, tmp_path / "language", seed=4),
    }
    llm = LLM(str(family_model.path), EngineConfig(enable_lora=True, max_loras=2))
    loaded = {name: llm.load_lora(name, path) for name, path in paths.items()}
    assert loaded["tower"].touches_tower and not loaded["language"].touches_tower
    vision = llm.engine.runner.vision
    case = chat_case(encode_image(make_image(112, 84, seed=9)), "What is in this picture?")
    plan = [(None, None), ("language", loaded["language"]), ("tower", loaded["tower"])]
    encoded = []
    for name, adapter in plan:
        oracle = _oracle(family_model, paths.get(name))
        expected = oracle.generate(oracle.process(oracle.chat_text(case.oracle_messages), case.images), GREEDY.max_tokens)
        for sight in ("cold", "repeat"):
            [result] = llm.generate([case.prompt], GREEDY, lora=adapter)
            assert_tokens_match(result.token_ids, expected, context=f"adapter {name}, {sight}")
        assert result.usage.cached_tokens > 0, f"adapter {name}: its own blocks are a prefix hit"
        encoded.append(vision.num_items_encoded)
    # The base model and the language-only adapter share the image's embeddings; the tower
    # adapter's are its own, under the derived mm_hash, and differ.
    num_parts = encoded[0]
    assert encoded == [num_parts, num_parts, 2 * num_parts]
    outputs = llm.engine.runner.encoder_outputs
    plain = [h for h in list(outputs.keys()) if mm_hash_for_adapter(h, loaded["tower"].fingerprint) in outputs]
    assert plain, "the tower adapter's embeddings are not keyed by the derived mm_hash"
    derived = mm_hash_for_adapter(plain[0], loaded["tower"].fingerprint)
    assert not torch.equal(outputs[plain[0]], outputs[derived])
