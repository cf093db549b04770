"""Our Gemma3 text decoder over a paged KV cache.

Per layer (Gemma's "sandwich" norms; every norm is OffsetRMSNorm, gain 1 + w):
  a = post_attention_norm(o_proj(attn(rope(q_norm(q_proj(n))), rope(k_norm(k_proj(n))), v_proj(n))))
      where n = input_norm(x)
  h = x + a
  y = h + post_feedforward_norm(down(gelu_tanh(gate(m)) * up(m)))   where m = pre_feedforward_norm(h)
Embeddings are scaled by sqrt(hidden) (image embeddings, merged in afterwards, are not).
Attention scale is query_pre_attn_scalar ** -0.5. Layers are "sliding_attention" (keys within the
last ``sliding_window`` positions, RoPE base of the local layers) or "full_attention" (every key,
the global RoPE base, with linear scaling where configured). Tokens of one image attend to each
other both ways on every layer: the model runner passes the image spans in the AttentionBatch.
Positions are 1-D: row 0 of the (3, N) positions every family carries.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from kernels.attention import AttentionBackend, AttentionBatch
from services.models.gemma3.config import FULL, SLIDING, RopeConfig, TextConfig
from services.models.layers import GatedMLP, OffsetRMSNorm, PagedAttention
from services.models.paged_decoder import DecoderInputs, PagedDecoder


class RotaryEmbedding(nn.Module):
    def __init__(self, rope: RopeConfig, head_dim: int) -> None:
        super().__init__()
        inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq / rope.linear_factor, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (N,) -> cos, sin of shape (N, head_dim)."""
        freqs = positions[:, None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


class DecoderLayer(nn.Module):
    def __init__(self, config: TextConfig, layer_type: str) -> None:
        super().__init__()
        self.layer_type = layer_type
        heads = (config.num_heads, config.num_kv_heads, config.head_dim)
        self.self_attn = PagedAttention(
            config.hidden_size,
            *heads,
            qkv_bias=config.attention_bias,
            o_bias=config.attention_bias,
            scale=config.query_pre_attn_scalar**-0.5,
            qk_norm=functools.partial(OffsetRMSNorm, eps=config.rms_norm_eps),
            sliding_window=config.sliding_window if layer_type == SLIDING else None,
        )
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, functools.partial(F.gelu, approximate="tanh"))
        eps = config.rms_norm_eps
        self.input_layernorm = OffsetRMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = OffsetRMSNorm(config.hidden_size, eps)
        self.pre_feedforward_layernorm = OffsetRMSNorm(config.hidden_size, eps)
        self.post_feedforward_layernorm = OffsetRMSNorm(config.hidden_size, eps)

    def forward(self, x, cos, sin, kv_cache, batch, backend) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, batch, backend))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class TextDecoder(PagedDecoder):
    def __init__(self, config: TextConfig) -> None:
        # Gemma3 always ties the LM head to the embedding table.
        super().__init__(config.vocab_size, config.hidden_size, tie_word_embeddings=config.tie_word_embeddings)
        self.config = config
        self.layers = nn.ModuleList(DecoderLayer(config, kind) for kind in config.layer_types)
        self.norm = OffsetRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.kind_to_rotary = nn.ModuleDict({kind: RotaryEmbedding(config.kind_to_rope[kind], config.head_dim) for kind in (SLIDING, FULL)})
        # As transformers: sqrt(hidden) as a float32 tensor, multiplied in the embedding's dtype.
        self.embed_scale = torch.tensor(config.hidden_size**0.5)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        embeds = super().embed(token_ids)
        return embeds * self.embed_scale.to(embeds.dtype)

    def forward(
        self,
        inputs: DecoderInputs,
        positions: torch.Tensor,
        layer_kv: list[tuple[tuple[torch.Tensor, torch.Tensor], AttentionBatch]],
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """inputs.embeds (N, hidden), positions (3, N; 1-D, row 0 used) -> final hidden states."""
        kind_to_cos_sin = {kind: rotary(positions[0]) for kind, rotary in self.kind_to_rotary.items()}
        x = inputs.embeds
        for layer, (kv_cache, batch) in zip(self.layers, layer_kv):
            cos, sin = kind_to_cos_sin[layer.layer_type]
            x = layer(x, cos, sin, kv_cache, batch, backend)
        return self.norm(x)
