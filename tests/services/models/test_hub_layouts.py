"""Each family's Hub repository layout (tests/hub_layouts.py) loads as transformers loads it and is
served exactly: transformers loads every layout with no missing or unexpected weight, every field
our readers take agrees with transformers' model built from the same directory, and greedy output
equals transformers' ``generate`` on text, RGB, greyscale, palette and RGBA images (Gemma3 with
Pan-and-Scan off and on)."""

from __future__ import annotations

import pytest
import torch

from services.engine.config import EngineConfig
from services.engine.llm import LLM
from services.engine.sampling_params import SamplingParams
from services.preprocess.config import PreprocessConfig
from tests.factories import chat_case, encode_image, make_image
from tests.hub_layouts import LAYOUTS, write_layout
from tests.oracle import ReferenceOracle, assert_tokens_match

GREEDY_8 = SamplingParams(max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="session")
def layout_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub_layouts")
    return {name: write_layout(name, root / name) for name in LAYOUTS}


@pytest.fixture(scope="module")
def hf_model_of(layout_dirs):
    """The transformers model of a layout, loaded once, with its loading report."""
    from transformers import AutoModelForImageTextToText

    loaded = {}

    def load(name):
        if name not in loaded:
            model, info = AutoModelForImageTextToText.from_pretrained(str(layout_dirs[name]), dtype=torch.float32, output_loading_info=True)
            loaded[name] = (model.eval(), info)
        return loaded[name]

    return load


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_transformers_loads_the_layout_with_no_missing_or_unexpected_weight(name, hf_model_of):
    _, info = hf_model_of(name)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info


def _attention_and_mlp(model):
    """The text model, its first full-attention layer's attention and its first layer's MLP."""
    text = model.model.language_model
    attention = next(layer.self_attn for layer in text.layers if hasattr(layer, "self_attn"))
    return text, attention, text.layers[0].mlp


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_field_our_reader_takes_agrees_with_the_transformers_model(name, layout_dirs, hf_model_of):
    """Each field against the module transformers built from the same directory, not against the
    config object our reader also reads: a reader that fell back to its own default for a field
    the file leaves out would disagree here."""
    from services.models.registry import resolve_model

    model, _ = hf_model_of(name)
    ref = resolve_model(str(layout_dirs[name]))
    config = ref.family.read_config(ref.path)
    ours = config.text
    text, attn, mlp = _attention_and_mlp(model)
    embed = model.get_input_embeddings()
    assert config.model_type == LAYOUTS[name].model_type == model.config.model_type
    assert (ours.vocab_size, ours.hidden_size) == tuple(embed.weight.shape)
    assert ours.num_layers == len(text.layers)
    if getattr(ours, "moe", None) is not None:
        assert (ours.moe.num_experts, ours.moe.num_experts_per_tok) == (mlp.gate.num_experts, mlp.gate.top_k)
        assert ours.moe.intermediate_size == mlp.experts.intermediate_dim
        assert ours.moe.shared_intermediate_size == mlp.shared_expert.gate_proj.out_features
    else:
        assert ours.intermediate_size == mlp.gate_proj.out_features
    assert ours.head_dim == attn.head_dim
    query_rows = 2 if config.model_type.startswith("qwen3_5") else 1  # Qwen3.5: each head's query, then its gate
    assert ours.num_heads * ours.head_dim * query_rows == attn.q_proj.out_features
    assert ours.num_kv_heads * ours.head_dim == attn.k_proj.out_features
    assert ours.rms_norm_eps == getattr(text.norm, "variance_epsilon", getattr(text.norm, "eps", None))
    tied = model.lm_head.weight.data_ptr() == embed.weight.data_ptr()
    assert ours.tie_word_embeddings == tied
    assert config.image_token_id == model.config.image_token_id
    assert set(config.eos_token_ids) == set(torch.tensor(model.generation_config.eos_token_id).view(-1).tolist())
    if config.model_type == "gemma3":
        assert attn.scaling == pytest.approx(ours.query_pre_attn_scalar**-0.5)
        assert tuple(layer.self_attn.sliding_window for layer in text.layers) == config.shape.layer_windows
        assert tuple(layer.self_attn.layer_type for layer in text.layers) == ours.layer_types
        for kind, rope in ours.kind_to_rope.items():
            theirs = getattr(text.rotary_emb, f"{kind}_inv_freq")
            inv_freq = 1.0 / (rope.theta ** (torch.arange(0, ours.head_dim, 2, dtype=torch.int64).float() / ours.head_dim))
            torch.testing.assert_close(inv_freq / rope.linear_factor, theirs)
    else:
        assert list(ours.mrope_section) == list(text.rotary_emb.mrope_section)
        rotary = getattr(ours, "rotary_dim", ours.head_dim)
        inv_freq = 1.0 / (ours.rope_theta ** (torch.arange(0, rotary, 2, dtype=torch.int64).float() / rotary))
        torch.testing.assert_close(inv_freq, text.rotary_emb.inv_freq)
        if config.model_type.startswith("qwen3_5"):
            kinds = tuple("linear_attention" if hasattr(layer, "linear_attn") else "full_attention" for layer in text.layers)
            assert ours.layer_types == kinds
            delta = next(layer.linear_attn for layer in text.layers if hasattr(layer, "linear_attn"))
            state = config.shape.state
            assert (state.num_heads, state.key_dim, state.value_dim) == (delta.num_v_heads, delta.head_k_dim, delta.head_v_dim)
            assert (state.conv_dim, state.conv_width) == (delta.conv_dim, delta.conv_kernel_size - 1)
        if config.model_type == "qwen3_vl":
            assert ours.attention_bias == (attn.q_proj.bias is not None)
            assert ours.num_deepstack_levels == len(model.model.visual.deepstack_visual_indexes)


def _png(width, height, seed, mode="RGB"):
    return encode_image(make_image(width, height, seed=seed, mode=mode))


CASES = {
    "text": lambda: chat_case("Describe the weather in one sentence."),
    "rgb": lambda: chat_case(_png(112, 84, 1), "What is in this image?"),
    "grey": lambda: chat_case(_png(84, 112, 2, "L"), "What is in this image?"),
    "palette": lambda: chat_case(_png(96, 64, 3, "P"), "What is in this image?"),
    "rgba": lambda: chat_case(_png(64, 96, 4, "RGBA"), "What is in this image?"),
}
# Wide enough for Pan-and-Scan to crop (ratio 3 over its 1.2 threshold, crops past 256 px).
PAN_AND_SCAN_CASES = {
    "wide_rgb": lambda: chat_case(_png(900, 300, 5), "What is in this image?"),
    "tall_grey": lambda: chat_case(_png(280, 840, 6, "L"), "Describe it."),
}


def _check_exact(llm: LLM, oracle: ReferenceOracle, cases: dict, context: str) -> None:
    built = {name: make() for name, make in cases.items()}
    results = llm.generate([case.prompt for case in built.values()], GREEDY_8)
    for (name, case), result in zip(built.items(), results):
        inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images)
        assert llm.preprocessor.preprocess(case.prompt).prompt_token_ids == inputs.token_ids, f"{context}/{name}"
        assert_tokens_match(result.token_ids, oracle.generate(inputs, GREEDY_8.max_tokens), context=f"{context}/{name}")


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_the_layout_is_served_exactly(name, layout_dirs):
    path = layout_dirs[name]
    _check_exact(LLM(str(path), EngineConfig()), ReferenceOracle(path), CASES, name)


def test_gemma3_pan_and_scan_crops_are_served_exactly(layout_dirs):
    path = layout_dirs["gemma-3-4b-it"]
    llm = LLM(str(path), EngineConfig(), PreprocessConfig(pan_and_scan=True))
    oracle = ReferenceOracle(path, do_pan_and_scan=True)
    _check_exact(llm, oracle, PAN_AND_SCAN_CASES, "pan-and-scan")
    [item] = llm.preprocessor.preprocess(PAN_AND_SCAN_CASES["wide_rgb"]().prompt).mm_items[:1]
    assert len(llm.preprocessor.preprocess(PAN_AND_SCAN_CASES["wide_rgb"]().prompt).mm_items) > 1  # cropped
    assert item.image.grid_thw[0] == 1
