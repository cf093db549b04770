"""Encoder cache: refcounts, whole-item eviction only, LRU among unreferenced items."""

from __future__ import annotations

import random

import pytest

from services.engine.encoder_cache_manager import EncoderCacheManager


def test_lifecycle_follows_seed_000():
    cache = EncoderCacheManager(cache_size=10)
    assert not cache.check_and_update_cache("A", "aaa")
    cache.allocate("A", "aaa", 4)
    assert cache.check_and_update_cache("B", "aaa")
    cache.free_encoder_input("A", "aaa")
    assert "aaa" not in cache.freeable
    cache.free_encoder_input("B", "aaa")
    assert cache.freeable["aaa"] == 4 and "aaa" in cache  # unreferenced but still resident
    assert cache.check_and_update_cache("C", "aaa")  # revived from freeable
    assert "aaa" not in cache.freeable


def test_evicts_least_recently_freed_whole_items_only_when_needed():
    cache = EncoderCacheManager(cache_size=10)
    for name, size in (("x", 3), ("y", 3), ("z", 3)):
        cache.allocate("r", name, size)
    for name in ("y", "x", "z"):
        cache.free_encoder_input("r", name)
    cache.allocate("s", "w", 5)  # needs 4 more rows than free: evicts y (3) then x (3)
    assert cache.drain_evicted() == ["y", "x"]
    assert "z" in cache and "w" in cache and cache.num_free_slots == 10 - 3 - 5


def test_referenced_items_are_never_evicted():
    cache = EncoderCacheManager(cache_size=6)
    cache.allocate("A", "held", 4)
    assert not cache.can_allocate(3)
    with pytest.raises(ValueError):
        cache.allocate("B", "new", 3)


def test_random_workload_keeps_budget_and_evicts_whole_items_in_lru_order():
    rng = random.Random(1)
    cache = EncoderCacheManager(cache_size=50)
    sizes = {f"img{i}": rng.randrange(1, 20) for i in range(30)}
    users: dict[str, set[str]] = {}
    for _ in range(2000):
        name = rng.choice(list(sizes))
        request = f"req{rng.randrange(8)}"
        freeable_before = list(cache.freeable)
        if rng.random() < 0.5:
            if cache.check_and_update_cache(request, name) or (
                cache.can_allocate(sizes[name]) and not cache.allocate(request, name, sizes[name])
            ):
                users.setdefault(name, set()).add(request)
        else:
            cache.free_encoder_input(request, name)
            users.get(name, set()).discard(request)
        evicted = cache.drain_evicted()
        assert evicted == freeable_before[: len(evicted)]  # least recently freed first
        resident = sum(cache.mm_hash_to_num_embeds.values())
        assert resident + cache.num_free_slots == 50 and resident <= 50
        for item, size in cache.mm_hash_to_num_embeds.items():
            assert size == sizes[item]  # whole items only
        for item in cache.freeable:
            assert not cache.mm_hash_to_requests[item]


def test_eviction_order_is_lru_over_freeable_items():
    rng = random.Random(2)
    for _ in range(50):
        cache = EncoderCacheManager(cache_size=40)
        names = [f"i{k}" for k in range(8)]
        for name in names:
            cache.allocate("r", name, 5)
        order = names[:]
        rng.shuffle(order)
        for name in order:
            cache.free_encoder_input("r", name)
        need = rng.randrange(6, 40)
        cache.allocate("s", "new", need)
        evicted = cache.drain_evicted()
        assert evicted == order[: len(evicted)]
        assert 5 * (len(evicted) - 1) < need <= 5 * len(evicted)  # no more than needed
