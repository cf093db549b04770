"""Encoder cache accounting: which items' embeddings are resident.

The budget is counted in embedding rows. An item is referenced by the set of requests that still
need it; when that set empties, the item moves to the ``freeable`` LRU but stays resident, so a
later request with the same identifier hits. Eviction takes whole items only, least recently
freed first, and only when space is needed. Evicted identifiers are reported so the tensor store
can drop them (and the global index can be told).
"""

from __future__ import annotations

from collections import OrderedDict


class EncoderCacheManager:
    def __init__(self, cache_size: int) -> None:
        if cache_size <= 0:
            raise ValueError("cache_size must be positive")
        self.cache_size = cache_size
        self.num_free_slots = cache_size
        self.id_to_requests: dict[str, set[str]] = {}
        self.id_to_num_embeds: dict[str, int] = {}
        self.freeable: OrderedDict[str, int] = OrderedDict()
        self.num_freeable_slots = 0
        self._evicted: list[str] = []

    def __contains__(self, identifier: str) -> bool:
        return identifier in self.id_to_requests

    def check_and_update_cache(self, request_id: str, identifier: str) -> bool:
        """On a hit, add ``request_id`` as a reference (reviving a freeable item) and return True."""
        users = self.id_to_requests.get(identifier)
        if users is None:
            return False
        if not users:
            self.num_freeable_slots -= self.freeable.pop(identifier)
        users.add(request_id)
        return True

    def can_allocate(self, num_embeds: int) -> bool:
        """Whether ``num_embeds`` rows fit now, counting what evicting freeable items would free."""
        return num_embeds <= self.num_free_slots + self.num_freeable_slots

    def allocate(self, request_id: str, identifier: str, num_embeds: int) -> None:
        if identifier in self.id_to_requests:
            raise ValueError(f"{identifier} is already cached; use check_and_update_cache")
        if not self.can_allocate(num_embeds):
            raise ValueError(f"no room for {num_embeds} embedding rows")
        while num_embeds > self.num_free_slots:
            victim, size = self.freeable.popitem(last=False)
            del self.id_to_requests[victim]
            del self.id_to_num_embeds[victim]
            self.num_freeable_slots -= size
            self.num_free_slots += size
            self._evicted.append(victim)
        self.id_to_requests[identifier] = {request_id}
        self.id_to_num_embeds[identifier] = num_embeds
        self.num_free_slots -= num_embeds

    def free_encoder_input(self, request_id: str, identifier: str) -> None:
        users = self.id_to_requests.get(identifier)
        if users is None or request_id not in users:
            return
        users.discard(request_id)
        if not users:
            self.freeable[identifier] = self.id_to_num_embeds[identifier]
            self.num_freeable_slots += self.id_to_num_embeds[identifier]

    def free_request(self, request_id: str, identifiers: list[str]) -> None:
        for identifier in identifiers:
            self.free_encoder_input(request_id, identifier)

    def drain_evicted(self) -> list[str]:
        evicted, self._evicted = self._evicted, []
        return evicted
