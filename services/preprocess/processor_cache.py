"""Processor cache: mm_hash -> processed image, a byte-bounded LRU.

Eviction order: least recently used first (a hit moves an entry to the back). Invariant: the sum
of entry sizes never exceeds ``capacity_bytes``; an item larger than the whole budget is not
cached at all rather than flushing everything else.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

from services.models.family import ProcessedImage
from shared.types import MmHash


@dataclass(slots=True)
class CacheStats:
    num_hits: int = 0
    num_misses: int = 0
    num_evictions: int = 0
    num_bytes: int = 0
    num_entries: int = 0


class ProcessorCache:
    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        self.capacity_bytes = capacity_bytes
        self._hash_to_item: OrderedDict[MmHash, ProcessedImage] = OrderedDict()
        self.stats = CacheStats()

    def get(self, mm_hash: MmHash) -> ProcessedImage | None:
        item = self._hash_to_item.get(mm_hash)
        if item is None:
            self.stats.num_misses += 1
            return None
        self._hash_to_item.move_to_end(mm_hash)
        self.stats.num_hits += 1
        return item

    def __contains__(self, mm_hash: MmHash) -> bool:
        return mm_hash in self._hash_to_item

    def can_put(self, item: ProcessedImage) -> bool:
        return item.num_bytes <= self.capacity_bytes

    def put(self, mm_hash: MmHash, item: ProcessedImage) -> bool:
        """Insert ``item``, evicting LRU entries to make room. Returns False if it cannot fit."""
        if not self.can_put(item):
            return False
        previous = self._hash_to_item.pop(mm_hash, None)
        if previous is not None:
            self.stats.num_bytes -= previous.num_bytes
        while self.stats.num_bytes + item.num_bytes > self.capacity_bytes:
            _, evicted = self._hash_to_item.popitem(last=False)
            self.stats.num_bytes -= evicted.num_bytes
            self.stats.num_evictions += 1
        self._hash_to_item[mm_hash] = item
        self.stats.num_bytes += item.num_bytes
        self.stats.num_entries = len(self._hash_to_item)
        return True

    def __len__(self) -> int:
        return len(self._hash_to_item)


K = TypeVar("K")
V = TypeVar("V")


class BoundedMemo(Generic[K, V]):
    """An entry-bounded LRU map for small derived values (never more than ``max_entries``)."""

    def __init__(self, max_entries: int) -> None:
        if max_entries < 0:
            raise ValueError("max_entries must be >= 0")
        self.max_entries = max_entries
        self._key_to_value: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._key_to_value.get(key)
        if value is not None:
            self._key_to_value.move_to_end(key)
        return value

    def peek(self, key: K) -> V | None:
        """The value without marking it used: safe to call from another thread."""
        return self._key_to_value.get(key)

    def put(self, key: K, value: V) -> None:
        if self.max_entries == 0:
            return
        self._key_to_value[key] = value
        self._key_to_value.move_to_end(key)
        while len(self._key_to_value) > self.max_entries:
            self._key_to_value.popitem(last=False)

    def __len__(self) -> int:
        return len(self._key_to_value)
