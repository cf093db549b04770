"""A local Qwen2.5-VL checkpoint loads and runs the same way as the built-in Qwen2-VL models."""

from __future__ import annotations

import pytest

from services.models.registry import resolve_model
from tests.factories import chat_case, encode_image, make_image
from tests.oracle import ReferenceOracle, assert_tokens_match


@pytest.fixture(scope="module")
def qwen2_5_vl_dir(tmp_path_factory):
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from services.models.qwen2_vl.builtin import BUILTIN_SPECS, build_processor_parts
    from shared.models.weights import fill_deterministic

    out = tmp_path_factory.mktemp("qwen2_5_vl")
    raw = BUILTIN_SPECS["tiny"].config_dict()
    raw.update(architectures=["Qwen2_5_VLForConditionalGeneration"], model_type="qwen2_5_vl")
    raw["text_config"]["model_type"] = "qwen2_5_vl_text"
    raw["vision_config"] = {
        "model_type": "qwen2_5_vl",
        "depth": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 2,
        "out_hidden_size": raw["text_config"]["hidden_size"],
        "window_size": 112,
        "fullatt_block_indexes": [1],
        "spatial_merge_size": 2,
        "patch_size": 14,
        "temporal_patch_size": 2,
    }
    model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**raw)).to(torch.float32).eval()
    fill_deterministic(model, seed=7, std=0.3)
    model.save_pretrained(out)
    tokenizer, image_processor = build_processor_parts()
    tokenizer.save_pretrained(out)
    image_processor.save_pretrained(out)
    return out


def test_qwen2_5_vl_checkpoint_matches_its_oracle(qwen2_5_vl_dir):
    from services.engine.llm import LLM
    from services.engine.sampling_params import SamplingParams

    ref = resolve_model(str(qwen2_5_vl_dir))
    assert ref.model_type == "qwen2_5_vl"
    oracle = ReferenceOracle(qwen2_5_vl_dir)
    llm = LLM(str(qwen2_5_vl_dir))
    cases = [chat_case(encode_image(make_image(224, 168, seed=1)), "What is this?"), chat_case("No image here.")]
    results = llm.generate([c.prompt for c in cases], SamplingParams(max_tokens=12, ignore_eos=True))
    for case, result in zip(cases, results):
        inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images)
        assert llm.preprocessor.preprocess(case.prompt).prompt_token_ids == inputs.token_ids
        assert_tokens_match(result.token_ids, oracle.generate(inputs, 12), context="qwen2.5-vl")
    assert len(set(results[0].token_ids)) > 1
