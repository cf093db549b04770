"""Building blocks shared by the families' text decoders (each written as transformers computes
it, so float32 outputs match the oracle's)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from kernels.attention import AttentionBackend, AttentionBatch


class RMSNorm(nn.Module):
    """Llama/Qwen RMSNorm: normalise in float32, cast back, then scale by the weight."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class OffsetRMSNorm(nn.Module):
    """Gemma's RMSNorm: the gain is (1 + weight), applied in float32 before the cast back."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.float()
        out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (N, heads, head_dim); cos/sin (N, head_dim)."""
    cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    return x * cos + rotate_half(x) * sin


class PagedAttention(nn.Module):
    """q/k/v/o projections (checkpoint names q_proj...o_proj), optionally a per-head norm of q and
    k before RoPE (q_norm, k_norm), then attention over the paged KV through the backend."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        qkv_bias: bool,
        o_bias: bool,
        scale: float,
        qk_norm: Callable[[int], nn.Module] | None = None,
        sliding_window: int | None = None,
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=o_bias)
        self.q_norm = qk_norm(head_dim) if qk_norm is not None else nn.Identity()
        self.k_norm = qk_norm(head_dim) if qk_norm is not None else nn.Identity()
        self.scale = scale
        self.sliding_window = sliding_window

    def forward(self, x, cos, sin, kv_cache, batch: AttentionBatch, backend: AttentionBackend) -> torch.Tensor:
        n = x.shape[0]
        q = apply_rope(self.q_norm(self.q_proj(x).view(n, self.num_heads, self.head_dim)), cos, sin)
        k = apply_rope(self.k_norm(self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)), cos, sin)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = kv_cache
        backend.write_kv(k_cache, v_cache, k, v, batch)
        out = backend.attend(q, k_cache, v_cache, batch, self.scale, sliding_window=self.sliding_window)
        return self.o_proj(out.reshape(n, self.num_heads * self.head_dim))


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)), no biases."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: Callable[[torch.Tensor], torch.Tensor] = F.silu) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class PreNormLayer(nn.Module):
    """x + attn(rms(x)), then + mlp(rms(.)): the Llama/Qwen decoder layer."""

    def __init__(self, attention: PagedAttention, mlp: GatedMLP, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.self_attn = attention
        self.mlp = mlp
        self.input_layernorm = RMSNorm(hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)

    def forward(self, x, cos, sin, kv_cache, batch, backend) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, batch, backend)
        return x + self.mlp(self.post_attention_layernorm(x))
