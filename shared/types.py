"""Typed identifiers and small records that cross service boundaries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NewType

# Hex blake3 digest of one multimodal item (see shared.hashing.mm_hash).
MmHash = NewType("MmHash", str)
# Hex digest of one full KV block, chained over its parents (see shared.hashing.block_hashes).
BlockHash = NewType("BlockHash", str)


@dataclass(frozen=True, slots=True)
class PlaceholderRange:
    """The span of prompt tokens that one multimodal item's embeddings replace.

    Invariant: ``offset + length <= len(prompt_token_ids)`` and every token in the span is the
    item's placeholder token id.
    """

    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True, slots=True)
class GroupPlacement:
    """Where a video's temporal group sits in its clip, for M-RoPE positions (Qwen2-VL and
    Qwen2.5-VL): ``index`` 0 opens the clip, and ``time_position`` is the group's temporal
    position from the clip's start. It travels with the group's item, since the nodes that run
    the prompt lay out its positions again."""

    index: int
    time_position: int


@dataclass(frozen=True, slots=True)
class LoraRef:
    """The LoRA adapter a request asks for: the name it is served under, and the fingerprint of
    its files (services/models/fingerprint.py), which keys the cached work it computes
    (shared/hashing.py's "lora" block key). A node serves the request only with an adapter of
    that name and that fingerprint: never a stale or different copy."""

    name: str
    fingerprint: str
    # It changes the vision tower or projector: the request's image embeddings are its own, under
    # mm_hashes derived with the fingerprint (shared/hashing.py, mm_hash_for_adapter). An adapter
    # that leaves the tower alone shares the base model's embeddings.
    tower: bool = False
