"""Qwen3.5 config.json read through transformers' Qwen3_5Config, and its weight names.

The text config is hybrid: ``layer_types`` names each decoder layer "linear_attention" (a Gated
DeltaNet, keeping a fixed-size state) or "full_attention" (gated attention over KV); transformers
fills it, when absent, with one full-attention layer in every ``full_attention_interval`` (4).
Rotary embedding covers ``partial_rotary_factor`` of each head (a quarter by default), with
Qwen3-VL's interleaved M-RoPE sections (transformers' default 11/11/10).

``qwen3_5_moe`` replaces every layer's MLP by a mixture of experts (moe.py; ``MoeConfig``).

Weight names are Qwen3-VL's (qwen2_vl/config.py's mapping); the Hub checkpoints' multi-token
prediction head (``mtp.*``) maps to nothing and is skipped, as transformers skips it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.models.family import ModelConfig, StateShape
from services.models.hf_config import common_text_fields, eos_token_ids, load_config
from services.models.qwen2_vl.config import spatial_merge_size, weight_group

__all__ = ["MODEL_TYPES", "TextConfig", "read_config", "spatial_merge_size", "weight_group"]

MODEL_TYPES = ("qwen3_5", "qwen3_5_moe")
# Transformers' sections when rope_parameters names none (Qwen3_5TextRotaryEmbedding).
DEFAULT_MROPE_SECTION = (11, 11, 10)
LAYER_KINDS = ("linear_attention", "full_attention")


@dataclass(frozen=True, slots=True)
class MoeConfig:
    """Qwen3.5-MoE's feed-forward: every layer routes each token to ``num_experts_per_tok`` of
    ``num_experts`` experts, beside a gated shared expert."""

    num_experts: int
    num_experts_per_tok: int
    intermediate_size: int
    shared_intermediate_size: int


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
    rotary_dim: int  # the leading part of each head that turns; the rest passes through
    mrope_section: tuple[int, int, int]
    attention_bias: bool
    tie_word_embeddings: bool
    layer_types: tuple[str, ...]
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel: int
    moe: MoeConfig | None = None  # None: a dense MLP of intermediate_size (qwen3_5)

    @property
    def state_shape(self) -> StateShape | None:
        """What each linear-attention layer keeps per request (services/engine/kv/recurrent_state.py);
        None when every layer is full attention."""
        layers = tuple(i for i, kind in enumerate(self.layer_types) if kind == "linear_attention")
        if not layers:
            return None
        key_dim = self.linear_num_key_heads * self.linear_key_head_dim
        return StateShape(
            layers=layers,
            conv_dim=2 * key_dim + self.linear_num_value_heads * self.linear_value_head_dim,
            conv_width=self.linear_conv_kernel - 1,
            num_heads=self.linear_num_value_heads,
            key_dim=self.linear_key_head_dim,
            value_dim=self.linear_value_head_dim,
        )


def _rope(text) -> tuple[float, float, tuple[int, int, int]]:
    rope = text.rope_parameters
    kind = rope.get("rope_type", "default")
    if kind != "default":
        raise ValueError(f"Qwen3.5 RoPE type {kind!r} is not supported (default is)")
    section = tuple(int(s) for s in rope.get("mrope_section", DEFAULT_MROPE_SECTION))
    if len(section) != 3:
        raise ValueError(f"mrope_section {section} must have three (t, h, w) entries")
    return float(rope["rope_theta"]), float(rope.get("partial_rotary_factor", 1.0)), section  # type: ignore[return-value]


def text_config_of(hf) -> TextConfig:
    text = hf.text_config
    if text.hidden_act != "silu":
        raise ValueError(f"Qwen3.5 text hidden_act {text.hidden_act!r} is not supported (silu is)")
    theta, partial, section = _rope(text)
    rotary_dim = int(text.head_dim * partial)
    if sum(section) != rotary_dim // 2:
        raise ValueError(f"mrope_section {section} must sum to half the rotary dimension ({rotary_dim // 2})")
    layer_types = tuple(text.layer_types)
    if len(layer_types) != text.num_hidden_layers or any(kind not in LAYER_KINDS for kind in layer_types):
        raise ValueError(f"layer_types {layer_types} must name {text.num_hidden_layers} layers, each one of {', '.join(LAYER_KINDS)}")
    if text.linear_num_value_heads % text.linear_num_key_heads:
        raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")
    moe = None
    if hf.model_type == "qwen3_5_moe":
        moe = MoeConfig(text.num_experts, text.num_experts_per_tok, text.moe_intermediate_size, text.shared_expert_intermediate_size)
        if not 0 < moe.num_experts_per_tok <= moe.num_experts:
            raise ValueError(f"num_experts_per_tok {moe.num_experts_per_tok} must be between 1 and num_experts ({moe.num_experts})")
    fields = {**common_text_fields(text)} if moe is None else {**common_text_fields(text, intermediate_size=0)}
    return TextConfig(
        **fields,
        head_dim=text.head_dim,
        rope_theta=theta,
        rotary_dim=rotary_dim,
        mrope_section=section,
        attention_bias=bool(text.attention_bias),
        tie_word_embeddings=bool(hf.tie_word_embeddings),
        layer_types=layer_types,
        linear_num_key_heads=text.linear_num_key_heads,
        linear_num_value_heads=text.linear_num_value_heads,
        linear_key_head_dim=text.linear_key_head_dim,
        linear_value_head_dim=text.linear_value_head_dim,
        linear_conv_kernel=text.linear_conv_kernel_dim,
        moe=moe,
    )


def read_config(path: Path) -> ModelConfig:
    hf = load_config(path, MODEL_TYPES)
    return ModelConfig(
        model_type=hf.model_type,
        text=text_config_of(hf),
        hf=hf,
        image_token_id=int(hf.image_token_id),
        eos_token_ids=eos_token_ids(path, hf),
    )
