"""Built-in models: byte-reproducible, loadable offline by transformers, input-sensitive."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from services.models.registry import ModelNotFoundError, resolve_model
from tests.factories import chat_case, encode_image, make_image


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_build_is_byte_identical_across_processes(tmp_path, tiny_model):
    outs = []
    for name in ("A", "B"):
        out = tmp_path / name
        proc = subprocess.run(
            [sys.executable, "-m", "services.cli.main", "models", "build", "tiny", "--out", str(out)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": name == "A" and "1" or "2"},
            check=True,
        )
        assert "4/4" in proc.stderr  # progress is shown
        outs.append(out)
    names = sorted(p.name for p in outs[0].iterdir())
    assert "model.safetensors" in names and "tokenizer.json" in names and "preprocessor_config.json" in names
    assert names == sorted(p.name for p in outs[1].iterdir())
    for name in names:
        assert _digest(outs[0] / name) == _digest(outs[1] / name), name
    # The cached build used by every other test is the same model.
    assert _digest(outs[0] / "model.safetensors") == _digest(tiny_model.path / "model.safetensors")


def test_tiny_model_size_and_real_qwen2_vl_settings(tiny_model):
    stamp = json.loads((tiny_model.path / "tessera_build.json").read_text())
    assert 9_000_000 <= stamp["num_params"] <= 20_000_000
    pre = json.loads((tiny_model.path / "preprocessor_config.json").read_text())
    assert pre["size"] == {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 16384}
    config = json.loads((tiny_model.path / "config.json").read_text())
    assert config["model_type"] == "qwen2_vl" and config["image_token_id"] == 151655


def test_small_spec_is_about_200m_parameters():
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    from services.models.builtins.qwen2_vl import BUILTIN_SPECS

    with torch.device("meta"):
        model = Qwen2VLForConditionalGeneration(Qwen2VLConfig(**BUILTIN_SPECS["small"].config_dict()))
    num_params = sum(p.numel() for p in model.parameters())
    assert 150_000_000 <= num_params <= 250_000_000


def test_unknown_model_reference_is_a_clear_error(tmp_path):
    with pytest.raises(ModelNotFoundError, match="neither a built-in"):
        resolve_model(str(tmp_path / "nope"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelNotFoundError, match="not supported"):
        resolve_model(str(tmp_path))


def test_any_local_checkpoint_directory_resolves(tiny_model):
    ref = resolve_model(str(tiny_model.path))
    assert ref.path == tiny_model.path and ref.model_type == "qwen2_vl"


def _png(w, h, seed):
    return encode_image(make_image(w, h, seed=seed))


GENERATION_MATRIX = [
    chat_case("Describe the weather in one sentence."),
    chat_case("Write a haiku about the sea."),
    chat_case(_png(112, 112, 1), "What is in this image?"),
    chat_case(_png(112, 112, 2), "What is in this image?"),
    chat_case(_png(224, 168, 3), "Describe it."),
    chat_case("Compare", _png(56, 56, 4), "with", _png(84, 56, 5)),
    chat_case(_png(112, 112, 1), "Count the objects."),
    chat_case(
        _png(
            140,
            140,
            6,
        ),
        "caption",
    ),
]


def test_greedy_outputs_depend_on_the_input(oracle):
    """A 0.02-init random model emits one token whatever the input; ours must not."""
    outputs = []
    for case in GENERATION_MATRIX:
        inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images)
        tokens = oracle.generate(inputs, max_new_tokens=16).token_ids
        assert len(tokens) == 16
        assert len(set(tokens)) > 1, f"single repeated token: {tokens}"
        outputs.append(tuple(tokens))
    assert len(set(outputs)) == len(outputs), "distinct requests gave identical outputs"
