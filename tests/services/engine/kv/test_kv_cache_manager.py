"""KV cache manager: prefix lookup, all-or-nothing allocation, and bounds under random load."""

from __future__ import annotations

import random

import torch

from services.engine.kv.kv_cache_manager import KVCacheManager
from services.engine.request import Request
from services.engine.sampling_params import SamplingParams
from shared.block_events import BlockStored
from shared.index.kv_events import kv_index_events
from shared.index.memory_backend import InProcessIndex
from shared.index.types import NodeInfo, block_entry


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


def _prefill_chunk(kv: KVCacheManager, request: Request) -> None:
    """One prefill step up to the next state point (the scheduler's cut), its blocks filed after."""
    start = request.num_computed_tokens
    num_tokens = kv.tokens_to_state_point(request, start) or request.num_tokens - start
    assert kv.allocate(request, num_tokens)
    request.num_computed_tokens = start + num_tokens
    kv.cache_computed_blocks(request)


def test_a_hybrid_cache_tells_the_index_where_it_can_resume():
    # Block size 4, a state saved every 2 blocks and at the prompt's last full block (3), room for
    # one saved state: the index hears which held blocks have their state, and again when one goes.
    kv = KVCacheManager(num_blocks=16, block_size=4, state_slots=2, state_snapshots=1, state_interval_blocks=2)
    request = make_request("a", list(range(13)))
    hashes = request.update_block_hashes(4)
    index = InProcessIndex()
    epoch = index.register_node(NodeInfo("hybrid", "prefill", "h:1"), ttl_s=30)

    _prefill_chunk(kv, request)  # blocks 0-1, state after block 1
    first = kv_index_events(kv.drain_events())
    assert first.kv_stored == {hashes[0]: block_entry("device", resumable=False), hashes[1]: "device"}
    index.publish("hybrid", epoch, first)
    assert index.lookup([], hashes[:3]).node_to_num_prefix_blocks == {"hybrid": 2}

    _prefill_chunk(kv, request)  # block 2, its state saved: block 1's evicted
    second = kv_index_events(kv.drain_events())
    assert second.kv_stored == {hashes[2]: "device", hashes[1]: block_entry("device", resumable=False)}
    index.publish("hybrid", epoch, second)
    assert index.lookup([], hashes[:3]).node_to_num_prefix_blocks == {"hybrid": 3}
    assert index.lookup([], hashes[:2]).node_to_num_prefix_blocks == {}


def test_a_full_attention_cache_reports_only_its_blocks():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    request = make_request("a", list(range(13)))
    assert _run_prefill(kv, request)
    assert all(isinstance(event, BlockStored) for event in kv.drain_events())


def test_a_saved_state_is_evicted_with_its_block():
    # Four pages: the first request's two blocks are cached with a state after block 1; a second,
    # different request needs every page, so both cached blocks go, and the state with them.
    kv = KVCacheManager(num_blocks=4, block_size=4, state_slots=1, state_snapshots=2, state_interval_blocks=2)
    first = make_request("a", list(range(9)))
    _prefill_chunk(kv, first)
    hashes = first.update_block_hashes(4)
    assert kv.snapshots.holds(hashes[1])
    kv.free(first)
    kv.drain_events()
    second = make_request("b", list(range(100, 116)))
    assert kv.allocate(second, 16)
    assert not kv.snapshots.holds(hashes[1]) and len(kv.snapshots) == 0
    index_events = kv_index_events(kv.drain_events())
    assert set(index_events.kv_evicted) == {hashes[0], hashes[1]} and not index_events.kv_stored
