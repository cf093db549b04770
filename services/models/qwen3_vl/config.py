"""Qwen3-VL config.json read through transformers' Qwen3VLConfig (which turns the Hub's older
``rope_scaling`` + ``rope_theta`` into ``rope_parameters``), and its weight names.

Weight names are those of Qwen2-VL's newer and older vintages, so the mapping is Qwen2-VL's:
  text:   "model.language_model.X" | "model.X"   -> "X"   (plus "lm_head.weight")
  vision: "model.visual.X" | "visual.X"           -> "X"
The Hub's Qwen3-VL checkpoints already use transformers 5's names (transformers has no conversion
rule for qwen3_vl); the older form is accepted for fine-tunes saved by other tools. The vision
config's ``spatial_merge_size`` is read where Qwen2-VL's is, too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.models.family import ModelConfig
from services.models.hf_config import common_text_fields, eos_token_ids, load_config
from services.models.qwen2_vl.config import spatial_merge_size, weight_group

__all__ = ["TextConfig", "read_config", "spatial_merge_size", "weight_group"]

# Transformers' sections when rope_parameters names none (Qwen3VLTextRotaryEmbedding).
DEFAULT_MROPE_SECTION = (24, 20, 20)


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


def _rope(text) -> tuple[float, tuple[int, int, int]]:
    rope = text.rope_parameters
    kind = rope.get("rope_type", "default")
    if kind != "default":
        raise ValueError(f"Qwen3-VL RoPE type {kind!r} is not supported (default is)")
    # transformers always interleaves Qwen3-VL's M-RoPE; it does not read "mrope_interleaved".
    section = tuple(int(s) for s in rope.get("mrope_section", DEFAULT_MROPE_SECTION))
    if len(section) != 3:
        raise ValueError(f"mrope_section {section} must have three (t, h, w) entries")
    return float(rope["rope_theta"]), section  # type: ignore[return-value]


def text_config_of(hf) -> TextConfig:
    """Our text config from transformers' Qwen3VLTextConfig (head_dim defaults to 128 there, not
    hidden / heads; tie_word_embeddings is the top-level config's, which transformers reads)."""
    text = hf.text_config
    if text.hidden_act != "silu":
        raise ValueError(f"Qwen3-VL text hidden_act {text.hidden_act!r} is not supported (silu is)")
    theta, section = _rope(text)
    deepstack = hf.vision_config.deepstack_visual_indexes
    if len(deepstack) > text.num_hidden_layers:
        raise ValueError(f"{len(deepstack)} DeepStack levels for {text.num_hidden_layers} decoder layers")
    return TextConfig(
        **common_text_fields(text),
        head_dim=text.head_dim,
        rope_theta=theta,
        mrope_section=section,
        attention_bias=bool(text.attention_bias),
        tie_word_embeddings=bool(hf.tie_word_embeddings),
        num_deepstack_levels=len(deepstack),
    )


def read_config(path: Path) -> ModelConfig:
    hf = load_config(path, ("qwen3_vl",))
    return ModelConfig(
        model_type=hf.model_type,
        text=text_config_of(hf),
        hf=hf,
        image_token_id=int(hf.image_token_id),
        eos_token_ids=eos_token_ids(path, hf),
    )
