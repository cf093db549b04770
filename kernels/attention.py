"""The attention-backend contract and the factory that picks a backend in one place.

Paged KV layout (per layer): k_cache and v_cache are [num_blocks, block_size, num_kv_heads,
head_dim] ("NHD", flashinfer's layout too). Token t of a request lives in slot
block_table[t // block_size] * block_size + t % block_size.

A step's batch packs every scheduled request's new tokens contiguously (prefill chunks and
decode tokens alike). Request i owns query rows [query_start_loc[i], query_start_loc[i+1]) and
attends causally over its first context_lens[i] tokens, the new ones being the last.

Two refinements, both of Gemma3 (and both as transformers masks them):
  - bidirectional_spans[i]: absolute token ranges [start, end) of request i whose tokens also see
    each other both ways (one image's tokens). A span overlapping a step's new tokens lies whole
    inside them (the scheduler never splits one), so the mask is known from the step alone.
  - attend(..., sliding_window=W): a layer that sees only keys k > q - W, for query position q.
    Applied after the span rule: allowed(q, k) = (k <= q or same span) and k > q - W.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(slots=True)
class AttentionBatch:
    query_start_loc: list[int]  # len num_reqs + 1, cumulative new-token counts
    context_lens: list[int]  # tokens in context per request, new tokens included
    block_tables: list[list[int]]  # block ids per request, at least ceil(context_len / block_size)
    slot_mapping: torch.Tensor  # [num_new_tokens] int64: where each new token's K/V is written
    block_size: int
    # Per request: absolute [start, end) ranges attended both ways; None when no request has any.
    bidirectional_spans: list[list[tuple[int, int]]] | None = None
    plan: object | None = None  # what the backend's prepare() made for this batch, read by attend()

    @property
    def num_reqs(self) -> int:
        return len(self.context_lens)


class AttentionBackend(Protocol):
    name: str

    def prepare(self, batch: AttentionBatch, *, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        """Called once per step before the layers run: plan anything shared by all layers."""

    def write_kv(self, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: AttentionBatch) -> None:
        """Store the new tokens' K/V ([num_new_tokens, num_kv_heads, head_dim]) into their slots."""

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        batch: AttentionBatch,
        scale: float,
        *,
        sliding_window: int | None = None,
    ) -> torch.Tensor:
        """q: [num_new_tokens, num_heads, head_dim] -> output of the same shape."""
