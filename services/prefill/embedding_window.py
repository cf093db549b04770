"""Which of a request's items to make resident next: the window (pure logic, on the engine thread).

A prefill node brings a request's images and video groups in prompt order, as many as the
embedding cache has room for, and the next ones as the engine frees the rows of those it has
computed past (embedding_feed.py). One rule keeps requests that feed side by side from waiting
on each other forever: a request references only a run of items in prompt order from where the
engine computes next (``start``), so every row it pins belongs to an item it can compute through
now. Each plan restores the rule from scratch: it drops the request's references, then, walking
the items that end after ``start`` in order:
- resident and referenced by another request: claimed, at no cost in rows;
- resident and referenced by none (the cache's freeable LRU): claimed if its rows fit the room;
- lacking: joins the window if its rows fit what is left of the room.
The walk stops at the first item that does not fit. Room is the cache's free rows plus the rows
of freeable items (allocating evicts those). One call, on the engine thread, so nothing runs
between the drop and the claims.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from services.engine.encoder_cache_manager import EncoderCacheManager
from services.engine.remote_request import PromptItem
from shared.types import MmHash


@dataclass(slots=True)
class Window:
    lacking: list[PromptItem] = field(default_factory=list)  # to bring, in prompt order
    num_claimed: int = 0  # resident items referenced for the request by this plan
    complete: bool = False  # every item the request still needs is referenced for it


def plan_window(cache: EncoderCacheManager, request_id: str, items: Sequence[PromptItem], start: int) -> Window:
    """Claim the resident items of the run from ``start`` and name the lacking ones among them."""
    held = {i.mm_hash for i in items if request_id in cache.mm_hash_to_requests.get(i.mm_hash, ())}
    cache.free_request(request_id, list(held))
    window = Window()
    room = cache.num_free_slots + cache.num_freeable_slots
    seen: set[MmHash] = set()
    for item in items:
        if item.placeholder.end <= start or item.mm_hash in seen:
            continue
        seen.add(item.mm_hash)
        users = cache.mm_hash_to_requests.get(item.mm_hash)
        rows = item.placeholder.length
        if users is None or not users:  # lacking, or freeable: either takes rows from the room
            if rows > room:
                return window
            room -= rows
        if users is None:
            window.lacking.append(item)
        else:
            cache.check_and_update_cache(request_id, item.mm_hash)
            window.num_claimed += item.mm_hash not in held
    window.complete = not window.lacking
    return window
