"""What a KV block pool reports when a block gains or loses its hash (the prefix cache changes).
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
