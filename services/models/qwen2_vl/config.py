"""Qwen2-VL / Qwen2.5-VL config.json, and the weight names of every checkpoint vintage.

Weight names are normalized to two groups, whatever the checkpoint's vintage:
  text:   "model.language_model.X" | "model.X"   -> "X"   (plus "lm_head.weight")
  vision: "model.visual.X" | "visual.X"           -> "X"
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from services.models.checkpoint import eos_token_ids
from services.models.family import ModelConfig


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


def read_config(path: Path) -> ModelConfig:
    raw = json.loads((path / "config.json").read_text())
    text = raw.get("text_config") or raw
    rope = text.get("rope_parameters") or text.get("rope_scaling") or raw.get("rope_scaling") or {}
    num_heads = text["num_attention_heads"]
    tie = raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
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
            rope_theta=rope.get("rope_theta", text.get("rope_theta", raw.get("rope_theta", 1000000.0))),
            mrope_section=tuple(rope.get("mrope_section", (16, 24, 24))),
            tie_word_embeddings=bool(tie),
        ),
        raw=raw,
        image_token_id=raw.get("image_token_id", 151655),
        eos_token_ids=eos_token_ids(path, raw, text),
    )


def spatial_merge_size(config: ModelConfig) -> int:
    return int(config.raw.get("vision_config", {}).get("spatial_merge_size", 2))


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
