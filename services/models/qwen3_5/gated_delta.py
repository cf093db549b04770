"""Qwen3.5's linear-attention layer, the Gated DeltaNet, over per-request state slots.

q, k and v come from one projection through a depthwise causal convolution (kernel K, then
SiLU), whose last K - 1 inputs are one half of a request's state; the recurrence over them
(kernels/gated_delta.py) keeps the other half, a matrix per value head. Query and key heads serve
num_v / num_k value heads each; g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b). The
output is RMS-normalised per head and gated by SiLU(z): out_proj(norm(o) * silu(z)).

A prompt chunk takes the chunked form from its request's slot; the single-token rows of decoding
requests are gathered from their slots and take one batched recurrent step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.gated_delta import StateBatch, chunked_delta_rule, l2norm, recurrent_step
from services.models.qwen3_5.config import TextConfig


class GatedRMSNorm(nn.Module):
    """RMS-normalise in float32, scale by the weight in the input dtype, then gate by SiLU(z)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        out = x.float()
        out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * out.to(dtype)
        return (out * F.silu(gate.float())).to(dtype)


class GatedDeltaNet(nn.Module):
    """Checkpoint names as transformers' Qwen3_5GatedDeltaNet (``linear_attn.*``)."""

    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_k_heads, self.num_v_heads = config.linear_num_key_heads, config.linear_num_value_heads
        self.key_dim, self.value_dim = config.linear_key_head_dim, config.linear_value_head_dim
        self.keys_width = self.num_k_heads * self.key_dim
        self.values_width = self.num_v_heads * self.value_dim
        conv_dim = 2 * self.keys_width + self.values_width
        self.in_proj_qkv = nn.Linear(hidden, conv_dim, bias=False)
        self.in_proj_z = nn.Linear(hidden, self.values_width, bias=False)
        self.in_proj_b = nn.Linear(hidden, self.num_v_heads, bias=False)
        self.in_proj_a = nn.Linear(hidden, self.num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, config.linear_conv_kernel, groups=conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = GatedRMSNorm(self.value_dim, config.rms_norm_eps)
        self.out_proj = nn.Linear(self.values_width, hidden, bias=False)

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor], batch: StateBatch) -> torch.Tensor:
        """x (N, hidden) -> (N, hidden); reads and advances each request's state slot."""
        conv_state, recurrent = state
        mixed = self.in_proj_qkv(x)
        z = self.in_proj_z(x)
        beta = self.in_proj_b(x).sigmoid()
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)
        out = x.new_zeros(x.shape[0], self.num_v_heads, self.value_dim)
        for run in batch.chunks:
            rows = slice(run.first_row, run.first_row + run.num_rows)
            window = torch.cat([conv_state[run.slot], mixed[rows].T.to(conv_state.dtype)], dim=1)
            conv_state[run.slot] = window[:, -conv_state.shape[2] :]
            q, k, v = self._heads(self._convolve(window[None])[0].T)
            q = q * self.key_dim**-0.5  # as transformers' chunked path scales: a product
            out[rows], recurrent[run.slot] = chunked_delta_rule(q, k, v, g[rows], beta[rows].float(), recurrent[run.slot])
        if batch.single_rows.numel():
            rows, slots = batch.single_rows, batch.single_slots
            window = torch.cat([conv_state[slots], mixed[rows][:, :, None].to(conv_state.dtype)], dim=2)
            conv_state[slots] = window[:, :, 1:]
            q, k, v = self._heads(self._convolve(window)[:, :, -1])
            q = q / self.key_dim**0.5  # as transformers' recurrent path scales: a quotient
            step_out, recurrent[slots] = recurrent_step(q, k, v, g[rows], beta[rows].float(), recurrent[slots])
            out[rows] = step_out.to(out.dtype)
        gated = self.norm(out.reshape(-1, self.value_dim), z.reshape(-1, self.value_dim))
        return self.out_proj(gated.reshape(x.shape[0], self.values_width))

    def _convolve(self, window: torch.Tensor) -> torch.Tensor:
        """(B, C, K - 1 + L) inputs, state first -> (B, C, L) SiLU of the causal convolution."""
        return F.silu(F.conv1d(window, self.conv1d.weight, groups=window.shape[1]))

    def _heads(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(n, conv_dim) -> q, k (n, num_v_heads, key_dim), l2-normalised, float32; v (n,
        num_v_heads, value_dim). Each key head serves consecutive value heads."""
        n, repeat = rows.shape[0], self.num_v_heads // self.num_k_heads
        q, k, v = torch.split(rows.float(), [self.keys_width, self.keys_width, self.values_width], dim=-1)
        q, k = (l2norm(x.reshape(n, self.num_k_heads, self.key_dim).repeat_interleave(repeat, dim=1)) for x in (q, k))
        return q, k, v.reshape(n, self.num_v_heads, self.value_dim)
