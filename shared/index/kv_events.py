"""Translate a node's block-pool events into index events."""

from __future__ import annotations

from shared.index.types import IndexEvents


def kv_index_events(pool_events, tier: str = "device") -> IndexEvents:
    from services.engine.kv.block_pool import BlockEvicted, BlockStored

    events = IndexEvents()
    for event in pool_events:
        if isinstance(event, BlockStored):
            events.kv_stored[event.block_hash] = tier
            if event.block_hash in events.kv_evicted:
                events.kv_evicted.remove(event.block_hash)
        elif isinstance(event, BlockEvicted):
            events.kv_stored.pop(event.block_hash, None)
            events.kv_evicted.append(event.block_hash)
    return events
