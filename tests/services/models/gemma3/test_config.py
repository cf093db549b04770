"""Gemma3 checkpoints of either vintage read the same: transformers 5's config (layer_types,
rope_parameters per layer kind) and the Hub's older one (sliding_window_pattern, rope_theta with
rope_scaling, rope_local_base_freq); the Hub's weight names and transformers 5's module names."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors import safe_open
from safetensors.torch import save_file

from services.engine.sampling_params import SamplingParams
from services.models.gemma3.config import FULL, SLIDING, read_config, weight_group
from tests.factories import chat_case, encode_image, make_image


def _older_vintage(raw: dict) -> dict:
    """The same model described as the Hub's configs described it before transformers 5."""
    text = dict(raw["text_config"])
    rope = text.pop("rope_parameters")
    kinds = text.pop("layer_types")
    text.pop("_sliding_window_pattern", None)
    text["sliding_window_pattern"] = kinds.index(FULL) + 1
    text["rope_theta"] = rope[FULL]["rope_theta"]
    text["rope_scaling"] = {"rope_type": rope[FULL]["rope_type"], "factor": rope[FULL]["factor"]}
    text["rope_local_base_freq"] = rope[SLIDING]["rope_theta"]
    return {**raw, "text_config": text}


def test_both_config_vintages_read_the_same(gemma3_model, tmp_path):
    raw = json.loads((gemma3_model.path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(_older_vintage(raw)))
    older, current = read_config(tmp_path).text, read_config(gemma3_model.path).text
    assert older == current
    assert current.layer_types == (SLIDING, SLIDING, SLIDING, FULL)
    assert current.kind_to_rope[FULL].linear_factor == 8.0 and current.kind_to_rope[SLIDING].linear_factor == 1.0


def test_softcapping_is_refused_with_a_clear_error(gemma3_model, tmp_path):
    raw = json.loads((gemma3_model.path / "config.json").read_text())
    raw["text_config"]["final_logit_softcapping"] = 30.0
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        read_config(tmp_path)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("language_model.model.layers.0.mlp.up_proj.weight", ("text", "layers.0.mlp.up_proj.weight")),
        ("model.language_model.layers.0.mlp.up_proj.weight", ("text", "layers.0.mlp.up_proj.weight")),
        ("language_model.lm_head.weight", ("text", "lm_head.weight")),
        ("lm_head.weight", ("text", "lm_head.weight")),
        ("vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight", ("vision", "vision_tower.encoder.layers.0.mlp.fc1.weight")),
        ("model.vision_tower.encoder.layers.0.mlp.fc1.weight", ("vision", "vision_tower.encoder.layers.0.mlp.fc1.weight")),
        ("multi_modal_projector.mm_input_projection_weight", ("vision", "multi_modal_projector.mm_input_projection_weight")),
        ("model.multi_modal_projector.mm_soft_emb_norm.weight", ("vision", "multi_modal_projector.mm_soft_emb_norm.weight")),
        ("some.other.tensor", None),
    ],
)
def test_weight_names_of_either_vintage_map_to_one_name(name, expected):
    assert weight_group(name) == expected


def test_a_checkpoint_with_transformers_5_module_names_serves_the_same_tokens(gemma3_model, make_gemma3_llm, tmp_path):
    """The built-in saves the Hub's names; rename every tensor to transformers 5's module names."""
    renamed = tmp_path / "renamed"
    shutil.copytree(gemma3_model.path, renamed)
    hub_to_module = {"language_model.model.": "model.language_model.", "vision_tower.vision_model.": "model.vision_tower."}
    hub_to_module["multi_modal_projector."] = "model.multi_modal_projector."
    with safe_open(str(gemma3_model.path / "model.safetensors"), framework="pt") as handle:
        tensors = {}
        for name in handle.keys():
            prefix = next((p for p in hub_to_module if name.startswith(p)), "")
            tensors[hub_to_module.get(prefix, "") + name[len(prefix) :]] = handle.get_tensor(name)
    save_file(tensors, str(renamed / "model.safetensors"), metadata={"format": "pt"})
    prompt = chat_case(encode_image(make_image(80, 80, seed=3)), "What is it?").prompt
    greedy = SamplingParams(max_tokens=8, ignore_eos=True)
    from services.engine.llm import LLM

    [ours] = LLM(str(renamed)).generate([prompt], greedy)
    [reference] = make_gemma3_llm().generate([prompt], greedy)
    assert ours.token_ids == reference.token_ids


def test_pixels_received_over_the_wire_must_fit_their_view(gemma3_model):
    """What a prefill node checks before encoding pushed pixels itself (adaptive dispatch)."""
    import torch

    from services.models.gemma3.family import FAMILY

    config = FAMILY.read_config(gemma3_model.path)
    size = config.hf.vision_config.image_size
    side = int(config.hf.mm_tokens_per_image**0.5)
    one_view = torch.zeros(1, 3, size, size)
    assert FAMILY.pixels_match(config, one_view, (1, side, side), side * side)
    assert not FAMILY.pixels_match(config, one_view, (1, side, side), side * side - 1)
    assert not FAMILY.pixels_match(config, torch.zeros(1, 3, size, size - 1), (1, side, side), side * side)
    assert not FAMILY.pixels_match(config, torch.zeros(side * side, 588), (1, side, side), side * side)  # Qwen-shaped rows
