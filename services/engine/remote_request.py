"""Rebuild an engine Request on a node that received the prompt over the wire (prefill and
decode nodes): token ids and image identities only, positions recomputed locally by the
model's family."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from services.engine.request import MmFeature, Request
from services.engine.sampling_params import SamplingParams
from services.models.lora.adapter import LoraAdapter
from shared.types import GroupPlacement, MmHash, PlaceholderRange

# (num_tokens, ranges, grids) -> ((3, num_tokens) positions, delta): the family's, for one model.
PositionsFn = Callable[
    [int, Sequence[PlaceholderRange], Sequence[tuple[int, int, int]], Sequence[GroupPlacement | None]], tuple[torch.Tensor, int]
]


@dataclass(frozen=True, slots=True)
class PromptItem:
    mm_hash: MmHash
    placeholder: PlaceholderRange
    grid_thw: tuple[int, int, int]
    placement: GroupPlacement | None = None  # a video's temporal group (shared/types.py)


def build_request(
    request_id: str,
    token_ids: list[int],
    items: list[PromptItem],
    sampling: SamplingParams,
    cache_salt: str | None,
    positions_fn: PositionsFn,
    lora: LoraAdapter | None = None,
) -> Request:
    """A request computed from token ids and image items alone: every image's embeddings must be
    in the node's encoder cache before the request is scheduled (pulled from an encoder, or
    encoded by the node's own tower beside its engine)."""
    ranges, grids = [i.placeholder for i in items], [i.grid_thw for i in items]
    positions, delta = positions_fn(len(token_ids), ranges, grids, [i.placement for i in items])
    return Request(
        request_id=request_id,
        prompt_token_ids=list(token_ids),
        sampling=sampling,
        mrope_positions=positions,
        mrope_delta=delta,
        mm_features=[MmFeature(i.mm_hash, i.placeholder, i.grid_thw, None) for i in items],
        cache_salt=cache_salt,
        lora=lora,
    )
