"""Translate a node's block-pool events into index events."""

from __future__ import annotations

from collections.abc import Iterable

from shared.block_events import BlockEvicted, BlockStored, StateKept
from shared.index.types import IndexEvents, block_entry


def kv_index_events(pool_events: Iterable[BlockStored | BlockEvicted | StateKept], tier: str = "device") -> IndexEvents:
    events = IndexEvents()
    for event in pool_events:
        if isinstance(event, BlockStored):
            events.kv_stored[event.block_hash] = tier
            if event.block_hash in events.kv_evicted:
                events.kv_evicted.remove(event.block_hash)
        elif isinstance(event, BlockEvicted):
            events.kv_stored.pop(event.block_hash, None)
            events.kv_evicted.append(event.block_hash)
        elif isinstance(event, StateKept):
            events.kv_stored[event.block_hash] = block_entry(tier, resumable=event.kept)
    return events
