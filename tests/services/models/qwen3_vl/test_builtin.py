"""Built-in Qwen3-VL checkpoints: real Qwen3-VL settings, loadable offline by transformers,
reproducible, input-sensitive; and the config reader over both config vintages."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from services.models.builtins.qwen2_tokens import SPECIAL_TOKEN_TO_ID
from services.models.builtins.qwen3_vl import BUILTIN_SPECS
from services.models.builtins.qwen3_vl_template import CHAT_TEMPLATE
from services.models.qwen3_vl.config import read_config, weight_group
from tests.factories import chat_case, encode_image, make_image

EXPECTED_FILES = {
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "preprocessor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tessera_build.json",
}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_checkpoint_files_and_real_qwen3_vl_settings(qwen3vl_model):
    path = qwen3vl_model.path
    assert qwen3vl_model.model_type == "qwen3_vl" and {p.name for p in path.iterdir()} == EXPECTED_FILES
    assert 9_000_000 <= json.loads((path / "tessera_build.json").read_text())["num_params"] <= 12_000_000  # mostly the embedding
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["Qwen3VLForConditionalGeneration"] and config["tie_word_embeddings"] is True
    ids = (config["image_token_id"], config["video_token_id"], config["vision_start_token_id"], config["vision_end_token_id"])
    assert ids == (151655, 151656, 151652, 151653)
    rope = config["text_config"]["rope_parameters"]
    assert rope["mrope_interleaved"] is True and rope["mrope_section"] == [6, 5, 5] and rope["rope_theta"] == 5_000_000.0
    vision = config["vision_config"]
    assert (vision["patch_size"], vision["spatial_merge_size"], vision["temporal_patch_size"]) == (16, 2, 2)
    assert vision["deepstack_visual_indexes"] == [0, 1] and vision["num_position_embeddings"] == 2304
    generation = json.loads((path / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [151645, 151643] and generation["do_sample"] is False
    pre = json.loads((path / "preprocessor_config.json").read_text())
    assert pre["size"] == {"shortest_edge": 256 * 256, "longest_edge": 4096 * 4096}
    assert (pre["patch_size"], pre["merge_size"], pre["temporal_patch_size"]) == (16, 2, 2)
    assert pre["image_mean"] == [0.5] * 3 and pre["image_std"] == [0.5] * 3


def test_special_tokens_keep_qwen_ids_and_the_template_is_qwen3_vl(qwen3vl_oracle):
    tokenizer = qwen3vl_oracle.tokenizer
    for token in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"):
        assert tokenizer.convert_tokens_to_ids(token) == SPECIAL_TOKEN_TO_ID[token], token
    assert (SPECIAL_TOKEN_TO_ID["<|image_pad|>"], SPECIAL_TOKEN_TO_ID["<|im_end|>"]) == (151655, 151645)
    assert tokenizer.chat_template == CHAT_TEMPLATE
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "And this?"}]},
    ]
    # No default system turn (Qwen2-VL's template adds one).
    assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is this?<|im_end|>\n"
        "<|im_start|>assistant\nA cat.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>And this?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    rendered = tokenizer.apply_chat_template(system, tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_transformers_loads_every_weight(qwen3vl_model):
    from transformers import AutoModelForImageTextToText

    model, info = AutoModelForImageTextToText.from_pretrained(qwen3vl_model.path, dtype=torch.float32, output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}, info  # nothing missing, unexpected or mismatched
    assert type(model).__name__ == "Qwen3VLForConditionalGeneration"


def test_build_is_byte_identical_across_processes(qwen3vl_model, tmp_path, repo_root):
    out = tmp_path / "again"
    out.mkdir()
    code = "import sys; from pathlib import Path; from services.models.builtins.qwen3_vl import BUILTIN_SPECS, write_checkpoint; "
    code += "write_checkpoint(BUILTIN_SPECS['qwen3vl-tiny'], Path(sys.argv[1]), lambda _m: None)"
    # A different hash seed: set or dict iteration order must not leak into the files.
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", code, str(out)], cwd=repo_root, env=env, check=True, capture_output=True)
    names = EXPECTED_FILES - {"tessera_build.json"}
    assert {p.name for p in out.iterdir()} == names
    for name in sorted(names):
        assert _sha256(out / name) == _sha256(qwen3vl_model.path / name), name


def _png(w, h, seed):
    return encode_image(make_image(w, h, seed=seed))


def test_greedy_outputs_depend_on_image_and_text(qwen3vl_oracle):
    """A 0.02-init random model emits one token whatever the input; this one must not."""
    cases = {
        "a": chat_case(_png(112, 112, 1), "What is in this image?"),
        "b": chat_case(_png(112, 112, 2), "What is in this image?"),
        "a2": chat_case(_png(112, 112, 1), "Count the objects."),
        "t1": chat_case("Describe the weather in one sentence."),
        "t2": chat_case("Write a haiku about the sea."),
    }
    outputs = {}
    for name, case in cases.items():
        inputs = qwen3vl_oracle.process(qwen3vl_oracle.chat_text(case.oracle_messages), case.images)
        outputs[name] = qwen3vl_oracle.generate(inputs, 8).token_ids
        assert len(set(outputs[name])) > 1, f"{name}: single repeated token {outputs[name]}"
    assert outputs["a"] != outputs["b"], "the image is ignored"
    assert outputs["a"] != outputs["a2"] and outputs["t1"] != outputs["t2"], "the text is ignored"


def test_small_spec_size():
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(Qwen3VLConfig(**BUILTIN_SPECS["qwen3vl-small"].config_dict()))
    num_params = sum(p.numel() for p in model.parameters())
    assert 160_000_000 <= num_params <= 220_000_000  # 117M of it the 151936 x 768 embedding table


def test_spec_rejects_sections_that_do_not_fill_head_dim():
    spec = BUILTIN_SPECS["qwen3vl-tiny"]
    fields = {name: getattr(spec, name) for name in type(spec).__slots__}
    with pytest.raises(ValueError, match="mrope_section"):
        type(spec)(**{**fields, "mrope_section": (8, 5, 5)})
    with pytest.raises(ValueError, match="DeepStack"):
        type(spec)(**{**fields, "deepstack_visual_indexes": (0, 3)})


def test_config_reader_takes_the_hubs_older_form(qwen3vl_model, tmp_path):
    """The Hub's configs (transformers 4.57) give rope_scaling + rope_theta and name the vision
    config "qwen3_vl"; both forms read the same."""
    raw = json.loads((qwen3vl_model.path / "config.json").read_text())
    text = dict(raw["text_config"])
    rope = text.pop("rope_parameters")
    text["rope_theta"] = rope.pop("rope_theta")
    text["rope_scaling"] = rope
    old = {**raw, "text_config": text, "vision_config": {**raw["vision_config"], "model_type": "qwen3_vl"}}
    (tmp_path / "config.json").write_text(json.dumps(old))
    new_text, old_text = read_config(qwen3vl_model.path).text, read_config(tmp_path).text
    assert old_text == new_text
    assert (new_text.rope_theta, new_text.mrope_section, new_text.num_deepstack_levels) == (5_000_000.0, (6, 5, 5), 2)
    assert new_text.tie_word_embeddings and not new_text.attention_bias and new_text.head_dim == 32


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("model.language_model.layers.0.self_attn.q_norm.weight", ("text", "layers.0.self_attn.q_norm.weight")),
        ("model.layers.0.self_attn.q_norm.weight", ("text", "layers.0.self_attn.q_norm.weight")),
        ("lm_head.weight", ("text", "lm_head.weight")),
        ("model.visual.deepstack_merger_list.1.linear_fc2.bias", ("vision", "deepstack_merger_list.1.linear_fc2.bias")),
        ("visual.pos_embed.weight", ("vision", "pos_embed.weight")),
        ("mtp.layers.0.weight", None),
    ],
)
def test_weight_names_of_both_vintages(name, expected):
    assert weight_group(name) == expected


@pytest.mark.parametrize(("head_dim", "section"), [(32, (6, 5, 5)), (128, (24, 20, 20)), (64, (12, 10, 10))])
def test_interleaved_mrope_is_transformers_bit_for_bit(qwen3vl_model, head_dim, section):
    """Our rotary tables against transformers' Qwen3VLTextRotaryEmbedding, at the real checkpoints'
    sections too (where the last frequencies past 3 x section fall back to the temporal axis)."""
    from transformers import Qwen3VLTextConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    from services.models.qwen3_vl.decoder import InterleavedMRotaryEmbedding

    ours = InterleavedMRotaryEmbedding(head_dim, read_config(qwen3vl_model.path).text.rope_theta, section)
    rope = {"rope_type": "default", "rope_theta": 5_000_000.0, "mrope_section": list(section), "mrope_interleaved": True}
    theirs = Qwen3VLTextRotaryEmbedding(Qwen3VLTextConfig(head_dim=head_dim, rope_parameters=rope))
    positions = torch.stack([torch.arange(40), torch.arange(40) // 5 + 3, torch.arange(40) % 5 + 3])  # distinct t, h, w
    cos, sin = ours(positions)
    ref_cos, ref_sin = theirs(torch.zeros(1, dtype=torch.float32), positions[:, None, :])
    assert torch.equal(cos, ref_cos[0]) and torch.equal(sin, ref_sin[0])
