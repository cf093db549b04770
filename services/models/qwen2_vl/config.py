"""Qwen2-VL / Qwen2.5-VL config.json read through transformers' config classes, and the weight
names of every checkpoint vintage.

Weight names are normalized to two groups, whatever the checkpoint's vintage:
  text:   "model.language_model.X" | "model.X"   -> "X"   (plus "lm_head.weight")
  vision: "model.visual.X" | "visual.X"           -> "X"
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.models.family import ModelConfig
from services.models.hf_config import common_text_fields, eos_token_ids, load_config

# Transformers' sections when rope_parameters names none (Qwen2VLRotaryEmbedding).
DEFAULT_MROPE_SECTION = (16, 24, 24)


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
    mrope_section: tuple[int, ...]
    tie_word_embeddings: bool


def text_config_of(hf) -> TextConfig:
    """Our text config from transformers' Qwen2VLTextConfig / Qwen2_5_VLTextConfig. Transformers
    moves the older flat layout (the 7B's: text fields at the top, ``rope_scaling`` with "mrope")
    into ``text_config`` and ``rope_parameters`` itself; the head size is not a config field there,
    its attention takes hidden_size / heads, and the sections default as its rotary embedding's."""
    text = hf.text_config
    if text.hidden_act != "silu":
        raise ValueError(f"{hf.model_type} text hidden_act {text.hidden_act!r} is not supported (silu is)")
    rope = text.rope_parameters
    return TextConfig(
        **common_text_fields(text),
        head_dim=text.hidden_size // text.num_attention_heads,
        rope_theta=float(rope["rope_theta"]),
        mrope_section=tuple(int(s) for s in rope.get("mrope_section", DEFAULT_MROPE_SECTION)),
        tie_word_embeddings=bool(hf.tie_word_embeddings),
    )


def read_config(path: Path) -> ModelConfig:
    hf = load_config(path, ("qwen2_vl", "qwen2_5_vl"))
    return ModelConfig(
        model_type=hf.model_type,
        text=text_config_of(hf),
        hf=hf,
        image_token_id=int(hf.image_token_id),
        eos_token_ids=eos_token_ids(path, hf),
    )


def spatial_merge_size(config: ModelConfig) -> int:
    return int(config.hf.vision_config.spatial_merge_size)


def weight_group(name: str) -> tuple[str, str] | None:
    if name.startswith(("model.visual.", "visual.")):
        return "vision", name.split("visual.", 1)[1]
    if name.startswith("model.language_model."):
        return "text", name[len("model.language_model.") :]
    if name.startswith("model."):
        return "text", name[len("model.") :]
    if name == "lm_head.weight":
        return "text", name
    return None
