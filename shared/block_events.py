"""What a KV block pool reports when a block gains or loses its hash (the prefix cache changes),
and what a hybrid model's KV cache adds: whether the state after a held block is kept.
They live here, below the engine, so that the index (shared/index/kv_events.py) can translate
them without importing the engine."""

from __future__ import annotations

from dataclasses import dataclass

from shared.types import BlockHash


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hash: BlockHash
    block_id: int


@dataclass(frozen=True, slots=True)
class BlockEvicted:
    block_hash: BlockHash
    block_id: int


@dataclass(frozen=True, slots=True)
class StateKept:
    """A hybrid model's node holds block ``block_hash`` and, per ``kept``, the linear layers'
    state after it (a prefix may resume there only if so). Follows the block's BlockStored, and
    comes again whenever the state is saved or dropped while the block stays held."""

    block_hash: BlockHash
    kept: bool
