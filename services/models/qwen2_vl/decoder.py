"""Our Qwen2-VL / Qwen2.5-VL text decoder over a paged KV cache.

Per layer:  h = x + o_proj(attn(rope(q_proj(rms(x))), rope(k_proj(rms(x))), v_proj(rms(x))))
            y = h + down(silu(gate(rms(h))) * up(rms(h)))
M-RoPE: the head_dim/2 rotary frequencies are split into mrope_section (t, h, w) chunks; chunk i
rotates by the token's position on axis i. cos/sin are then duplicated across the two halves
(rotate_half convention), as in Qwen2-VL.
Tokens from all scheduled requests are packed into one [num_tokens, hidden] batch; attention is
the only per-request operation and goes through the attention backend.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.attention import AttentionBackend, AttentionBatch
from services.models.layers import GatedMLP, PagedAttention, PreNormLayer, RMSNorm
from services.models.paged_decoder import DecoderInputs, PagedDecoder
from services.models.qwen2_vl.config import TextConfig


class MRotaryEmbedding(nn.Module):
    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        dim = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        if sum(config.mrope_section) != dim // 2:
            raise ValueError(f"mrope_section {config.mrope_section} must sum to head_dim/2 = {dim // 2}")
        self.mrope_section = list(config.mrope_section)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (3, N) -> cos, sin of shape (N, head_dim)."""
        freqs = positions[..., None].float() * self.inv_freq  # (3, N, dim/2)
        chunks = freqs.split(self.mrope_section, dim=-1)
        freqs = torch.cat([chunk[i % 3] for i, chunk in enumerate(chunks)], dim=-1)  # (N, dim/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def _layer(config: TextConfig) -> PreNormLayer:
    heads = (config.num_heads, config.num_kv_heads, config.head_dim)
    attention = PagedAttention(config.hidden_size, *heads, qkv_bias=True, o_bias=False, scale=config.head_dim**-0.5)
    return PreNormLayer(attention, GatedMLP(config.hidden_size, config.intermediate_size), config.hidden_size, config.rms_norm_eps)


class TextDecoder(PagedDecoder):
    def __init__(self, config: TextConfig) -> None:
        super().__init__(config.vocab_size, config.hidden_size, tie_word_embeddings=config.tie_word_embeddings)
        self.config = config
        self.layers = nn.ModuleList(_layer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = MRotaryEmbedding(config)

    def forward(
        self,
        inputs: DecoderInputs,
        positions: torch.Tensor,
        layer_kv: list[tuple[tuple[torch.Tensor, torch.Tensor], AttentionBatch]],
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """inputs.embeds (N, hidden), positions (3, N) -> final hidden states (N, hidden)."""
        cos, sin = self.rotary(positions)
        x = inputs.embeds
        for layer, (kv_cache, batch) in zip(self.layers, layer_kv):
            x = layer(x, cos, sin, kv_cache, batch, backend)
        return self.norm(x)
