"""Image and video items as a request with a LoRA adapter on the vision tower sees them.

Under an adapter that changes the tower or projector (LoraRef.tower) an item's embeddings are the
adapter's own, so it takes mm_hash_for_adapter (shared/hashing.py): the encoder cache, the
cluster index and the prefix KV all key it apart, and the same image encodes once per such
adapter. An adapter that leaves the tower alone keeps the plain mm_hash and shares the base
model's embeddings. Pixels do not depend on the adapter: an adapted mm_hash leads back to its
plain one, whose pixels the processor cache holds."""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol, TypeVar

from services.preprocess.processor_cache import BoundedMemo
from shared.hashing import mm_hash_for_adapter
from shared.types import LoraRef, MmHash


class _Item(Protocol):
    mm_hash: MmHash


Item = TypeVar("Item", bound=_Item)


class AdaptedItems:
    def __init__(self, max_entries: int) -> None:
        self._plain: BoundedMemo[MmHash, MmHash] = BoundedMemo(max_entries)  # adapted -> plain

    def apply(self, items: list[Item], lora: LoraRef | None) -> list[Item]:
        if lora is None or not lora.tower:
            return items
        adapted = []
        for item in items:
            mm_hash = mm_hash_for_adapter(item.mm_hash, lora.fingerprint)
            self._plain.put(mm_hash, item.mm_hash)
            adapted.append(replace(item, mm_hash=mm_hash))
        return adapted

    def plain(self, mm_hash: MmHash) -> MmHash:
        """The plain mm_hash of an adapted one (itself for any other)."""
        return self._plain.get(mm_hash) or mm_hash
