"""Qwen3-VL config.json (transformers 5's ``rope_parameters`` and the Hub's older ``rope_scaling`` +
``rope_theta``), and its weight names.

Weight names are those of Qwen2-VL's newer and older vintages, so the mapping is Qwen2-VL's:
  text:   "model.language_model.X" | "model.X"   -> "X"   (plus "lm_head.weight")
  vision: "model.visual.X" | "visual.X"           -> "X"
The Hub's Qwen3-VL checkpoints already use transformers 5's names (transformers has no conversion
rule for qwen3_vl); the older form is accepted for fine-tunes saved by other tools. The vision
config's ``spatial_merge_size`` is read where Qwen2-VL's is, too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from services.models.checkpoint import eos_token_ids
from services.models.family import ModelConfig
from services.models.qwen2_vl.config import spatial_merge_size, weight_group

__all__ = ["TextConfig", "read_config", "spatial_merge_size", "weight_group"]

# transformers' defaults when a config names no sections (Qwen3VLTextRotaryEmbedding) or no base
# (Qwen3VLTextConfig.default_theta; the real checkpoints all name theta 5e6).
DEFAULT_MROPE_SECTION = (24, 20, 20)
DEFAULT_ROPE_THETA = 500_000.0


@dataclass(frozen=True, slots=True)
class TextConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    mrope_section: tuple[int, int, int]
    attention_bias: bool
    tie_word_embeddings: bool
    # DeepStack: the vision tower's extra feature levels, added after decoder layers 0..n-1.
    num_deepstack_levels: int


def _rope(text: dict, raw: dict) -> tuple[float, tuple[int, int, int]]:
    rope = text.get("rope_parameters") or text.get("rope_scaling") or raw.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ValueError(f"Qwen3-VL RoPE type {kind!r} is not supported (default is)")
    # transformers always interleaves Qwen3-VL's M-RoPE; it does not read "mrope_interleaved".
    theta = float(rope.get("rope_theta", text.get("rope_theta", raw.get("rope_theta", DEFAULT_ROPE_THETA))))
    section = tuple(int(s) for s in rope.get("mrope_section", DEFAULT_MROPE_SECTION))
    if len(section) != 3:
        raise ValueError(f"mrope_section {section} must have three (t, h, w) entries")
    return theta, section  # type: ignore[return-value]


def read_config(path: Path) -> ModelConfig:
    raw = json.loads((path / "config.json").read_text())
    text = raw.get("text_config") or raw
    vision = raw.get("vision_config") or {}
    if text.get("hidden_act", "silu") != "silu":
        raise ValueError(f"Qwen3-VL text hidden_act {text['hidden_act']!r} is not supported (silu is)")
    num_heads = text["num_attention_heads"]
    theta, section = _rope(text, raw)
    deepstack = vision.get("deepstack_visual_indexes", (8, 16, 24))
    if len(deepstack) > text["num_hidden_layers"]:
        raise ValueError(f"{len(deepstack)} DeepStack levels for {text['num_hidden_layers']} decoder layers")
    return ModelConfig(
        model_type=raw["model_type"],
        text=TextConfig(
            vocab_size=text["vocab_size"],
            hidden_size=text["hidden_size"],
            intermediate_size=text["intermediate_size"],
            num_layers=text["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=text.get("num_key_value_heads") or num_heads,
            head_dim=text.get("head_dim") or text["hidden_size"] // num_heads,
            rms_norm_eps=text.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            mrope_section=section,
            attention_bias=bool(text.get("attention_bias", False)),
            # transformers reads the top-level flag (Qwen3VLTextConfig has none); older configs
            # may carry it in text_config only.
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            num_deepstack_levels=len(deepstack),
        ),
        raw=raw,
        image_token_id=raw.get("image_token_id", 151655),
        eos_token_ids=eos_token_ids(path, raw, text),
    )
