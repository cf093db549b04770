"""Gemma3 config.json (transformers 5's form and the Hub's older one), and its weight names.

Layer kinds: ``layer_types`` lists "sliding_attention" / "full_attention" per layer; older configs
give ``sliding_window_pattern`` P instead (every P-th layer global, the rest sliding).
RoPE per kind: transformers 5 nests ``rope_parameters`` by layer kind; older configs give the
global layers' ``rope_theta`` (+ ``rope_scaling``) and the local ones' ``rope_local_base_freq``.

Weight names, whatever the checkpoint's vintage:
  text:   "model.language_model.X" | "language_model.model.X"  -> "X"
          "lm_head.weight" | "language_model.lm_head.weight"     -> "lm_head.weight"
  vision: "model.vision_tower.X" | "vision_tower.X" | "vision_tower.vision_model.X"
                                                                  -> "vision_tower.X"
          "model.multi_modal_projector.X" | "multi_modal_projector.X" -> "multi_modal_projector.X"
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from services.models.checkpoint import eos_token_ids
from services.models.family import ModelConfig

SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True, slots=True)
class RopeConfig:
    theta: float
    linear_factor: float  # positions are divided by it ("linear" scaling); 1.0 for "default"


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
    query_pre_attn_scalar: float
    sliding_window: int
    layer_types: tuple[str, ...]
    kind_to_rope: dict[str, RopeConfig]
    attention_bias: bool

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        return tuple(self.sliding_window if kind == SLIDING else None for kind in self.layer_types)


def _rope(params: dict) -> RopeConfig:
    kind = params.get("rope_type", "default")
    if kind not in ("default", "linear"):
        raise ValueError(f"Gemma3 RoPE type {kind!r} is not supported (default and linear are)")
    return RopeConfig(theta=float(params["rope_theta"]), linear_factor=float(params.get("factor", 1.0)) if kind == "linear" else 1.0)


def _kind_to_rope(text: dict) -> dict[str, RopeConfig]:
    params = text.get("rope_parameters")
    if isinstance(params, dict) and SLIDING in params and FULL in params:
        return {SLIDING: _rope(params[SLIDING]), FULL: _rope(params[FULL])}
    scaling = text.get("rope_scaling") or {}
    full = {**scaling, "rope_type": scaling.get("rope_type", scaling.get("type", "default")), "rope_theta": text.get("rope_theta", 1e6)}
    return {SLIDING: _rope({"rope_type": "default", "rope_theta": text.get("rope_local_base_freq", 10000.0)}), FULL: _rope(full)}


def _layer_types(text: dict, num_layers: int) -> tuple[str, ...]:
    if text.get("layer_types"):
        return tuple(text["layer_types"])
    pattern = int(text.get("sliding_window_pattern", 6))
    return tuple(FULL if (i + 1) % pattern == 0 else SLIDING for i in range(num_layers))


def read_config(path: Path) -> ModelConfig:
    raw = json.loads((path / "config.json").read_text())
    text = raw.get("text_config") or {}
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        if text.get(name) is not None:
            raise ValueError(f"Gemma3 {name}={text[name]} is not supported (Gemma3 checkpoints set it to null)")
    if text.get("use_bidirectional_attention"):
        raise ValueError("Gemma3 text configs with use_bidirectional_attention (embedding models) are not served")
    num_layers = text["num_hidden_layers"]
    num_heads = text["num_attention_heads"]
    head_dim = text.get("head_dim") or text["hidden_size"] // num_heads
    return ModelConfig(
        model_type=raw["model_type"],
        text=TextConfig(
            vocab_size=text["vocab_size"],
            hidden_size=text["hidden_size"],
            intermediate_size=text["intermediate_size"],
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=text.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=text.get("rms_norm_eps", 1e-6),
            query_pre_attn_scalar=float(text.get("query_pre_attn_scalar", head_dim)),
            sliding_window=int(text.get("sliding_window", 4096)),
            layer_types=_layer_types(text, num_layers),
            kind_to_rope=_kind_to_rope(text),
            attention_bias=bool(text.get("attention_bias", False)),
        ),
        raw=raw,
        image_token_id=int(raw.get("image_token_id", raw.get("image_token_index", 262144))),
        eos_token_ids=eos_token_ids(path, raw, text),
    )


def tokens_per_side(config: ModelConfig) -> int:
    """Soft tokens per image side after the projector's average pool (16 for 256 per image)."""
    tokens = int(config.raw.get("mm_tokens_per_image", 256))
    side = int(round(tokens**0.5))
    if side * side != tokens:
        raise ValueError(f"mm_tokens_per_image {tokens} is not a square")
    return side


def weight_group(name: str) -> tuple[str, str] | None:
    for prefix in ("model.language_model.", "language_model.model."):
        if name.startswith(prefix):
            return "text", name[len(prefix) :]
    if name in ("lm_head.weight", "language_model.lm_head.weight"):
        return "text", "lm_head.weight"
    for part in ("vision_tower.", "multi_modal_projector."):
        for prefix in ("model." + part, part):
            if name.startswith(prefix):
                rest = name[len(prefix) :]
                # The Hub's SigLIP wraps its modules in "vision_model"; transformers 5 does not.
                return "vision", part + rest.removeprefix("vision_model.")
    return None
