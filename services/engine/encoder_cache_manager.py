"""Encoder cache accounting: which items' embeddings are resident.

The budget is counted in embedding rows. An item is referenced by the set of requests that still
need it; when that set empties, the item moves to the ``freeable`` LRU but stays resident, so a
later request with the same mm_hash hits. Eviction takes whole items only, least recently
freed first, and only when space is needed. Evicted mm_hashes are reported so the tensor store
can drop them (and the global index can be told).
"""

from __future__ import annotations

from collections import OrderedDict

from shared.types import MmHash


class EncoderCacheManager:
    def __init__(self, cache_size: int) -> None:
        if cache_size <= 0:
            raise ValueError("cache_size must be positive")
        self.cache_size = cache_size
        self.num_free_slots = cache_size
        self.mm_hash_to_requests: dict[MmHash, set[str]] = {}
        self.mm_hash_to_num_embeds: dict[MmHash, int] = {}
        self.freeable: OrderedDict[MmHash, int] = OrderedDict()
        self.num_freeable_slots = 0
        self._evicted: list[MmHash] = []
        self.num_evictions = 0  # items evicted, ever (a counter for metrics)

    def __contains__(self, mm_hash: MmHash) -> bool:
        return mm_hash in self.mm_hash_to_requests

    def check_and_update_cache(self, request_id: str, mm_hash: MmHash) -> bool:
        """On a hit, add ``request_id`` as a reference (reviving a freeable item) and return True."""
        users = self.mm_hash_to_requests.get(mm_hash)
        if users is None:
            return False
        if not users:
            self.num_freeable_slots -= self.freeable.pop(mm_hash)
        users.add(request_id)
        return True

    def can_allocate(self, num_embeds: int) -> bool:
        """Whether ``num_embeds`` rows fit now, counting what evicting freeable items would free."""
        return num_embeds <= self.num_free_slots + self.num_freeable_slots

    def allocate(self, request_id: str, mm_hash: MmHash, num_embeds: int) -> None:
        if mm_hash in self.mm_hash_to_requests:
            raise ValueError(f"{mm_hash} is already cached; use check_and_update_cache")
        if not self.can_allocate(num_embeds):
            raise ValueError(f"no room for {num_embeds} embedding rows")
        while num_embeds > self.num_free_slots:
            victim, size = self.freeable.popitem(last=False)
            del self.mm_hash_to_requests[victim]
            del self.mm_hash_to_num_embeds[victim]
            self.num_freeable_slots -= size
            self.num_free_slots += size
            self._evicted.append(victim)
            self.num_evictions += 1
        self.mm_hash_to_requests[mm_hash] = {request_id}
        self.mm_hash_to_num_embeds[mm_hash] = num_embeds
        self.num_free_slots -= num_embeds

    def free_encoder_input(self, request_id: str, mm_hash: MmHash) -> None:
        users = self.mm_hash_to_requests.get(mm_hash)
        if users is None or request_id not in users:
            return
        users.discard(request_id)
        if not users:
            self.freeable[mm_hash] = self.mm_hash_to_num_embeds[mm_hash]
            self.num_freeable_slots += self.mm_hash_to_num_embeds[mm_hash]

    def free_request(self, request_id: str, mm_hashes: list[MmHash]) -> None:
        for mm_hash in mm_hashes:
            self.free_encoder_input(request_id, mm_hash)

    def drain_evicted(self) -> list[MmHash]:
        evicted, self._evicted = self._evicted, []
        return evicted
