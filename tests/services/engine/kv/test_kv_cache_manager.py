"""KV cache manager: prefix lookup, all-or-nothing allocation, and bounds under random load."""

from __future__ import annotations

import random

import torch

from services.engine.kv.kv_cache_manager import KVCacheManager
from services.engine.request import Request
from services.engine.sampling_params import SamplingParams


def make_request(request_id: str, tokens: list[int]) -> Request:
    return Request(
        request_id=request_id,
        prompt_token_ids=list(tokens),
        sampling=SamplingParams(),
        mrope_positions=torch.arange(len(tokens)).expand(3, -1),
        mrope_delta=0,
    )


def _run_prefill(kv: KVCacheManager, request: Request) -> bool:
    cached = kv.find_cached_prefix(request)
    start = len(cached) * kv.block_size
    if not kv.allocate(request, request.num_tokens - start, cached):
        return False
    request.num_computed_tokens = request.num_tokens
    kv.cache_computed_blocks(request)
    return True


def test_prefix_hit_stops_at_first_miss_and_never_covers_the_last_token():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    first = make_request("a", list(range(12)))
    assert _run_prefill(kv, first)
    same = make_request("b", list(range(12)))
    assert len(kv.find_cached_prefix(same)) == 2  # 12 tokens: the third block holds the last token
    diverging = make_request("c", [0, 1, 2, 3, 99, 5, 6, 7, 8, 9, 10, 11, 12])
    assert len(kv.find_cached_prefix(diverging)) == 1


def test_request_that_does_not_fit_waits_without_taking_anything():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    big = make_request("big", list(range(20)))
    assert not kv.can_allocate(big, 20)
    assert not kv.allocate(big, 20)
    assert kv.pool.num_free_blocks == 4 and kv.block_table(big) == []


def test_random_workload_never_exceeds_the_pool():
    rng = random.Random(0)
    kv = KVCacheManager(num_blocks=24, block_size=4)
    live: list[Request] = []
    for step in range(300):
        if live and rng.random() < 0.4:
            kv.free(live.pop(rng.randrange(len(live))))
        else:
            prefix = [1, 2, 3, 4, 5, 6, 7, 8] if rng.random() < 0.5 else []
            request = make_request(f"r{step}", prefix + [rng.randrange(100) for _ in range(rng.randrange(1, 30))])
            if _run_prefill(kv, request):
                live.append(request)
        held = sum(len(kv.block_table(r)) for r in live)
        in_use = sum(1 for b in kv.pool.blocks if b.ref_count > 0)
        assert in_use <= 24 and in_use + kv.pool.num_free_blocks == 24
        assert held >= in_use  # shared prefix blocks are counted once in the pool
    for request in live:
        kv.free(request)
    assert kv.pool.num_free_blocks == 24
