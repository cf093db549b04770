"""Rebuild an engine Request on a node that received the prompt over the wire (prefill and
decode nodes): token ids and image identities only, M-RoPE positions recomputed locally."""

from __future__ import annotations

from dataclasses import dataclass

from services.engine.request import MmFeature, Request
from services.engine.sampling import SamplingParams
from services.preprocess.mrope import mrope_positions
from shared.types import MmHash, PlaceholderRange


@dataclass(frozen=True, slots=True)
class PromptItem:
    mm_hash: MmHash
    placeholder: PlaceholderRange
    grid_thw: tuple[int, int, int]


def build_request(
    request_id: str,
    token_ids: list[int],
    items: list[PromptItem],
    sampling: SamplingParams,
    cache_salt: str | None,
    merge_size: int,
) -> Request:
    """A request computed from token ids and image items alone: every image's embeddings must be
    in the node's encoder cache before the request is scheduled (pulled from an encoder, or
    encoded by the node's own tower beside its engine)."""
    positions, delta = mrope_positions(len(token_ids), [i.placeholder for i in items], [i.grid_thw for i in items], merge_size)
    return Request(
        request_id=request_id,
        prompt_token_ids=list(token_ids),
        sampling=sampling,
        mrope_positions=positions,
        mrope_delta=delta,
        mm_features=[MmFeature(i.mm_hash, i.placeholder, i.grid_thw, None) for i in items],
        cache_salt=cache_salt,
    )
