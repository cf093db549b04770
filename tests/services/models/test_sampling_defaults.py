"""A checkpoint's generation_config.json sampling defaults, read as vLLM reads them: only vLLM's
fields, only where they differ from transformers' GenerationConfig defaults; none under "vllm"."""

from __future__ import annotations

import json

import pytest

from services.models.sampling_defaults import NO_DEFAULTS, SamplingDefaults, read_sampling_defaults


def _with_generation_config(tmp_path, body: dict | str):
    (tmp_path / "generation_config.json").write_text(body if isinstance(body, str) else json.dumps(body))
    return tmp_path


def test_the_fields_that_differ_from_transformers_defaults_are_the_checkpoints(tmp_path):
    """Qwen2-VL-7B-Instruct's file."""
    body = {"do_sample": True, "repetition_penalty": 1.05, "temperature": 0.1, "top_k": 1, "top_p": 0.001, "eos_token_id": [1, 2]}
    expected = SamplingDefaults(repetition_penalty=1.05, temperature=0.1, top_k=1, top_p=0.001)
    assert read_sampling_defaults(_with_generation_config(tmp_path, body)) == expected


def test_values_equal_to_transformers_defaults_and_unknown_fields_are_not_defaults(tmp_path):
    body = {"temperature": 1.0, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.0, "max_new_tokens": 2048, "min_p": 0.05}
    assert read_sampling_defaults(_with_generation_config(tmp_path, body)) == SamplingDefaults(min_p=0.05)


def test_vllm_mode_a_missing_file_and_a_broken_one_give_none(tmp_path):
    assert read_sampling_defaults(tmp_path) is NO_DEFAULTS
    model_dir = _with_generation_config(tmp_path, {"top_k": 64})
    assert read_sampling_defaults(model_dir, "vllm") is NO_DEFAULTS
    assert read_sampling_defaults(_with_generation_config(tmp_path, "{not json")) is NO_DEFAULTS
    with pytest.raises(ValueError, match="generation_config must be one of auto, vllm"):
        read_sampling_defaults(model_dir, "model")
