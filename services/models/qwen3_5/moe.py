"""Qwen3.5-MoE's feed-forward block: a routed mixture of experts beside one gated shared expert.

  p = softmax(router(x)) in float32;  the top k experts of p, their weights renormalised to sum 1
  y = sum over chosen experts e of w_e * down_e(silu(gate_e(x)) * up_e(x))
      + sigmoid(shared_gate(x)) * shared_expert(x)
Expert weights are held as transformers 5 holds them in memory, one 3-D tensor per projection for
all experts (``experts.gate_up_proj`` (E, 2I, H): gate rows then up rows; ``experts.down_proj``
(E, H, I)). Checkpoints, the Hub's and what transformers saves, keep one tensor per expert and
projection (``experts.{e}.gate_proj.weight`` ...), fused on loading (``fuse_experts``).
Experts run one at a time over the rows that chose them, in expert order, each contribution added
into its rows, as transformers' eager loop sums them. The router is a plain weight, never
prepacked (kernels/cpu_linear.py): its logits choose experts, and a product summed in another
order could turn a near-tie.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from services.models.layers import GatedMLP
from services.models.qwen3_5.config import TextConfig


class Router(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden_size))


class Experts(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))


class SparseMoe(nn.Module):
    """Checkpoint names as transformers' Qwen3_5MoeSparseMoeBlock (``mlp.*``)."""

    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        assert config.moe is not None
        self.top_k = config.moe.num_experts_per_tok
        self.gate = Router(config.moe.num_experts, config.hidden_size)
        self.experts = Experts(config.moe.num_experts, config.hidden_size, config.moe.intermediate_size)
        self.shared_expert = GatedMLP(config.hidden_size, config.moe.shared_intermediate_size)
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = self.shared_expert(x)
        logits = F.linear(x, self.gate.weight)
        weights, chosen = torch.topk(F.softmax(logits, dim=-1, dtype=torch.float), self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(logits.dtype)
        out = torch.zeros_like(x)
        for expert in chosen.unique().tolist():  # ascending
            rows, rank = torch.where(chosen == expert)
            gate, up = F.linear(x[rows], self.experts.gate_up_proj[expert]).chunk(2, dim=-1)
            routed = F.linear(F.silu(gate) * up, self.experts.down_proj[expert]) * weights[rows, rank, None]
            out.index_add_(0, rows, routed.to(out.dtype))
        return out + torch.sigmoid(self.shared_expert_gate(x)) * shared


_PER_EXPERT = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")


def fuse_experts(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert checkpoint tensors stacked into each layer's ``gate_up_proj`` and ``down_proj``;
    other tensors, and already fused ones, as they are. Raises ValueError on a layer whose experts
    are not numbered 0..E-1 with all three projections each."""
    out: dict[str, torch.Tensor] = {}
    grouped: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for name, tensor in weights.items():
        match = _PER_EXPERT.match(name)
        if match is None:
            out[name] = tensor
            continue
        grouped.setdefault(match["prefix"], {}).setdefault(int(match["expert"]), {})[match["proj"]] = tensor
    for prefix, experts in grouped.items():
        if sorted(experts) != list(range(len(experts))) or any(len(projections) != 3 for projections in experts.values()):
            raise ValueError(f"{prefix}: experts must be numbered 0..{len(experts) - 1}, each with gate, up and down projections")
        ordered = [experts[e] for e in range(len(experts))]
        out[f"{prefix}.gate_up_proj"] = torch.stack([torch.cat([p["gate_proj"], p["up_proj"]]) for p in ordered])
        out[f"{prefix}.down_proj"] = torch.stack([p["down_proj"] for p in ordered])
    return out
