"""LoRA in the engine: requests with PEFT adapters (made by peft) are exact against transformers
with the adapter merged by peft, greedy float32: alone, repeated (a prefix hit on the adapter's own
blocks), and in one batch mixing two adapters and the base model. An adapter never reuses another
adapter's (or the base model's) prefix KV."""

from __future__ import annotations

import pytest
import torch

from services.engine.config import EngineConfig
from services.engine.llm import LLM
from services.engine.sampling_params import SamplingParams
from tests.factories import chat_case, encode_image, make_image
from tests.oracle import ReferenceOracle, assert_tokens_match
from tests.peft_adapters import make_adapter, merged_model

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


# Every built-in family; the batch-mixing and slot tests on Qwen2-VL's `tiny` only.
FAMILIES = ["tiny", "qwen3vl-tiny", "gemma3-tiny", "qwen3_5-tiny"]


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request):
    from services.models.registry import resolve_model

    return resolve_model(request.param, progress=lambda _m: None)


def _adapters(model, root):
    return {name: make_adapter(model.path, root / name, seed=seed) for name, seed in (("a", 1), ("b", 2))}


def _oracles(model, adapters):
    found = {None: ReferenceOracle(model.path)}
    for name, path in adapters.items():
        found[name] = ReferenceOracle(model.path, load_model=False)
        found[name].model = merged_model(model.path, path)
    return found


@pytest.fixture(scope="module")
def family_adapters(family_model, tmp_path_factory):
    return _adapters(family_model, tmp_path_factory.mktemp(f"adapters-{family_model.path.name}"))


@pytest.fixture(scope="module")
def family_oracles(family_model, family_adapters):
    return _oracles(family_model, family_adapters)


@pytest.fixture(scope="module")
def adapters(tiny_model, tmp_path_factory):
    return _adapters(tiny_model, tmp_path_factory.mktemp("adapters"))


@pytest.fixture(scope="module")
def oracles(tiny_model, adapters):
    return _oracles(tiny_model, adapters)


def _expected(oracle, case):
    return oracle.generate(oracle.process(oracle.chat_text(case.oracle_messages), case.images), GREEDY.max_tokens)


def _cases():
    image = encode_image(make_image(112, 84, seed=5))
    return [
        chat_case(image, "What is in this picture?"),
        chat_case("Write one sentence about rivers, lakes, mountains, forests, deserts and the open sea, in plain and simple words."),
    ]


def test_each_adapter_alone_and_repeated_matches_transformers_with_it_merged(family_model, family_adapters, family_oracles):
    llm = LLM(str(family_model.path), EngineConfig(enable_lora=True, max_loras=2))
    loaded = {name: llm.load_lora(name, path) for name, path in family_adapters.items()}
    oracles = family_oracles
    for case in _cases():
        outputs = {}
        for name, adapter in [(None, None), *loaded.items()]:
            expected = _expected(oracles[name], case)
            for sight in ("cold", "repeat"):
                [result] = llm.generate([case.prompt], GREEDY, lora=adapter)
                assert_tokens_match(result.token_ids, expected, context=f"adapter {name}, {sight}")
                if sight == "repeat":
                    assert result.usage.cached_tokens > 0, f"adapter {name}: its own blocks are a prefix hit"
            outputs[name] = expected.token_ids
        assert len({tuple(tokens) for tokens in outputs.values()}) == 3, "an adapter changed nothing"


def test_a_batch_mixing_two_adapters_and_the_base_is_exact_for_each(tiny_model, adapters, oracles):
    llm = LLM(str(tiny_model.path), EngineConfig(enable_lora=True, max_loras=2))
    loaded = {name: llm.load_lora(name, path) for name, path in adapters.items()}
    cases = _cases()
    plan = [(case, name) for case in cases for name in (None, "a", "b")]
    results = llm.generate([case.prompt for case, _ in plan], GREEDY, lora=[loaded.get(name) for _, name in plan])
    for (case, name), result in zip(plan, results):
        assert_tokens_match(result.token_ids, _expected(oracles[name], case), context=f"adapter {name} in a mixed batch")


def test_an_adapter_never_reuses_another_adapters_prefix(tiny_model, adapters):
    llm = LLM(str(tiny_model.path), EngineConfig(enable_lora=True, max_loras=2))
    a, b = (llm.load_lora(name, path) for name, path in adapters.items())
    case = _cases()[0]
    llm.generate([case.prompt], GREEDY, lora=a)
    [other] = llm.generate([case.prompt], GREEDY, lora=b)
    [base] = llm.generate([case.prompt], GREEDY)
    [again] = llm.generate([case.prompt], GREEDY, lora=a)
    assert (other.usage.cached_tokens, base.usage.cached_tokens) == (0, 0)
    assert again.usage.cached_tokens > 0


def test_more_adapters_than_slots_take_turns_and_stay_exact(tiny_model, adapters, oracles):
    """One slot, two adapters and the base in one call: "b" waits until no request uses the slot's
    adapter, then the slot is reloaded; the second "a" request does not wait behind "b" but runs
    beside the first (two loads in all). Each output is still its own adapter's."""
    llm = LLM(str(tiny_model.path), EngineConfig(enable_lora=True, max_loras=1))
    loaded = {name: llm.load_lora(name, path) for name, path in adapters.items()}
    case = _cases()[1]
    plan = ["a", "b", None, "a"]
    results = llm.generate([case.prompt] * len(plan), GREEDY, lora=[loaded.get(name) for name in plan])
    for name, result in zip(plan, results):
        assert_tokens_match(result.token_ids, _expected(oracles[name], case), context=f"adapter {name} with one slot")
    assert llm.engine.loras.num_loads == 2


def test_an_engine_without_lora_refuses_an_adapter(tiny_model, adapters):
    llm = LLM(str(tiny_model.path), EngineConfig())
    adapter = llm.load_lora("a", adapters["a"])
    with pytest.raises(ValueError, match="serves none"):
        llm.generate([_cases()[1].prompt], GREEDY, lora=adapter)


def test_an_adapter_for_another_model_is_refused_before_it_reaches_a_slot(tiny_model, tmp_path):
    """Names of this model's layers, sizes of another's: refused when read, with the reason."""
    import json

    from safetensors.torch import save_file

    from services.models.lora.files import LoraAdapterError

    module = "base_model.model.model.language_model.layers.0.self_attn.q_proj"
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8}))
    tensors = {f"{module}.lora_A.weight": torch.ones(4, 7), f"{module}.lora_B.weight": torch.ones(9, 4)}
    save_file(tensors, str(tmp_path / "adapter_model.safetensors"))
    llm = LLM(str(tiny_model.path), EngineConfig(enable_lora=True))
    with pytest.raises(LoraAdapterError, match="an adapter for another model"):
        llm.load_lora("other", tmp_path)
