"""Gemma3 config.json (transformers 5's form and the Hub's older one), and its weight names.

The file is read through transformers' Gemma3Config (services/models/hf_config.py), which turns
every vintage into one form: ``layer_types`` per layer (older files give ``sliding_window_pattern``)
and ``rope_parameters`` per layer kind (older files give ``rope_theta`` + ``rope_scaling`` for the
global layers and ``rope_local_base_freq`` for the local ones).

Weight names, whatever the checkpoint's vintage:
  text:   "model.language_model.X" | "language_model.model.X"  -> "X"
          "lm_head.weight" | "language_model.lm_head.weight"     -> "lm_head.weight"
  vision: "model.vision_tower.X" | "vision_tower.X" | "vision_tower.vision_model.X"
                                                                  -> "vision_tower.X"
          "model.multi_modal_projector.X" | "multi_modal_projector.X" -> "multi_modal_projector.X"
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.models.family import ModelConfig
from services.models.hf_config import common_text_fields, eos_token_ids, load_config

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
    tie_word_embeddings: bool

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        return tuple(self.sliding_window if kind == SLIDING else None for kind in self.layer_types)


def _rope(params: dict) -> RopeConfig:
    kind = params.get("rope_type", "default")
    if kind not in ("default", "linear"):
        raise ValueError(f"Gemma3 RoPE type {kind!r} is not supported (default and linear are)")
    return RopeConfig(theta=float(params["rope_theta"]), linear_factor=float(params.get("factor", 1.0)) if kind == "linear" else 1.0)


def _check_supported(text) -> None:
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(text, name, None) is not None:
            raise ValueError(f"Gemma3 {name}={getattr(text, name)} is not supported (Gemma3 checkpoints set it to null)")
    if getattr(text, "use_bidirectional_attention", False):
        raise ValueError("Gemma3 text configs with use_bidirectional_attention (embedding models) are not served")
    if text.hidden_activation != "gelu_pytorch_tanh":
        raise ValueError(f"Gemma3 hidden_activation {text.hidden_activation!r} is not supported (gelu_pytorch_tanh is)")


def text_config_of(hf) -> TextConfig:
    """Our text config from transformers' Gemma3TextConfig (its defaults fill what the file omits:
    the Hub's gemma-3-4b-it names no heads, head size, KV heads or query scale)."""
    text = hf.text_config
    _check_supported(text)
    rope = text.rope_parameters  # transformers normalizes every vintage to one entry per layer kind
    return TextConfig(
        **common_text_fields(text),
        head_dim=text.head_dim,
        query_pre_attn_scalar=float(text.query_pre_attn_scalar),
        sliding_window=int(text.sliding_window),
        layer_types=tuple(text.layer_types),
        kind_to_rope={SLIDING: _rope(rope[SLIDING]), FULL: _rope(rope[FULL])},
        attention_bias=bool(text.attention_bias),
        tie_word_embeddings=bool(hf.tie_word_embeddings),
    )


def read_config(path: Path) -> ModelConfig:
    hf = load_config(path, ("gemma3",))
    return ModelConfig(
        model_type=hf.model_type,
        text=text_config_of(hf),
        hf=hf,
        image_token_id=int(hf.image_token_id),
        eos_token_ids=eos_token_ids(path, hf),
    )


def tokens_per_side(config: ModelConfig) -> int:
    """Soft tokens per image side after the projector's average pool (16 for 256 per image)."""
    tokens = int(config.hf.mm_tokens_per_image)
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
