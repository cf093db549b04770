"""Our Qwen3.5 text decoder: hybrid layers over paged KV and per-request state.

Layer i is a Gated DeltaNet (gated_delta.py, state in a slot) or, where ``layer_types`` says
"full_attention" (every fourth by default), gated attention over the paged KV:
  q, gate = split(q_proj(n)) per head;  q, k RMS-normalised per head (gain 1 + w)
  o = attn(rope(q), rope(k), v) * sigmoid(gate);  out = o_proj(o)
RoPE turns only the first ``rotary_dim`` of each head (interleaved M-RoPE, as Qwen3-VL's); the
rest passes through. Every norm is the zero-centred RMSNorm (gain 1 + w, as Gemma's). Then
  h = x + mixer(rms(x)),  y = h + down(silu(gate(rms(h))) * up(rms(h))).
(qwen3_5_moe: the MLP is a mixture of experts, moe.py.) No DeepStack: an image's rows are its
merger's output only.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from kernels.attention import AttentionBackend, AttentionBatch
from services.models.layers import GatedMLP, OffsetRMSNorm, apply_rope
from services.models.paged_decoder import DecoderInputs, PagedDecoder
from services.models.qwen3_5.config import TextConfig
from services.models.qwen3_5.gated_delta import GatedDeltaNet
from services.models.qwen3_5.moe import SparseMoe
from services.models.qwen3_vl.decoder import InterleavedMRotaryEmbedding


def partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the leading cos.shape[-1] of each head (N, heads, head_dim); the rest unchanged."""
    rotary = cos.shape[-1]
    return torch.cat([apply_rope(x[..., :rotary], cos, sin), x[..., rotary:]], dim=-1)


class GatedAttention(nn.Module):
    """Checkpoint names as transformers' Qwen3_5Attention (``self_attn.*``)."""

    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, 2 * self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = OffsetRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = OffsetRMSNorm(self.head_dim, config.rms_norm_eps)
        self.scale = self.head_dim**-0.5

    def forward(self, x, cos, sin, kv_cache, batch: AttentionBatch, backend: AttentionBackend) -> torch.Tensor:
        n = x.shape[0]
        # Per head, the query then its gate (transformers' view(..., head_dim * 2) and chunk).
        q, gate = self.q_proj(x).view(n, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = partial_rope(self.q_norm(q), cos, sin)
        k = partial_rope(self.k_norm(self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)), cos, sin)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = kv_cache
        backend.write_kv(k_cache, v_cache, k, v, batch)
        out = backend.attend(q.contiguous(), k_cache, v_cache, batch, self.scale).reshape(n, self.num_heads * self.head_dim)
        return self.o_proj(out * torch.sigmoid(gate.reshape(n, -1)))


class HybridLayer(nn.Module):
    def __init__(self, config: TextConfig, kind: str) -> None:
        super().__init__()
        self.kind = kind
        if kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(config)
        else:
            self.self_attn = GatedAttention(config)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size) if config.moe is None else SparseMoe(config)
        norm = functools.partial(OffsetRMSNorm, config.hidden_size, config.rms_norm_eps)
        self.input_layernorm, self.post_attention_layernorm = norm(), norm()

    def forward(self, x, cos, sin, layer_input, backend: AttentionBackend) -> torch.Tensor:
        normed = self.input_layernorm(x)
        if self.kind == "linear_attention":
            mixed = self.linear_attn(normed, *layer_input)
        else:
            mixed = self.self_attn(normed, cos, sin, *layer_input, backend)
        x = x + mixed
        return x + self.mlp(self.post_attention_layernorm(x))


class TextDecoder(PagedDecoder):
    def __init__(self, config: TextConfig) -> None:
        super().__init__(config.vocab_size, config.hidden_size, tie_word_embeddings=config.tie_word_embeddings)
        self.config = config
        self.layers = nn.ModuleList(HybridLayer(config, kind) for kind in config.layer_types)
        self.norm = OffsetRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = InterleavedMRotaryEmbedding(config.rotary_dim, config.rope_theta, config.mrope_section)

    def forward(self, inputs: DecoderInputs, positions: torch.Tensor, layer_kv: list, backend: AttentionBackend) -> torch.Tensor:
        """inputs.embeds (N, hidden), positions (3, N); layer_kv per layer: (KV storage, its
        AttentionBatch) or, for a linear-attention layer, (state storage, the StateBatch)."""
        cos, sin = self.rotary(positions)
        x = inputs.embeds
        for layer, layer_input in zip(self.layers, layer_kv):
            x = layer(x, cos, sin, layer_input, backend)
        return self.norm(x)
