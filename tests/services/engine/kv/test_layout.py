"""KV layouts: layers grouped by window over one page pool, and the window rules of allocation,
release and prefix hits (pure logic, no model)."""

from __future__ import annotations

import torch

from services.engine.kv.kv_cache_manager import KVCacheManager
from services.engine.kv.layout import KVLayout
from services.engine.request import Request
from services.engine.sampling_params import SamplingParams


def make_request(request_id: str, tokens: list[int]) -> Request:
    positions = torch.arange(len(tokens)).expand(3, -1)
    return Request(
        request_id=request_id, prompt_token_ids=list(tokens), sampling=SamplingParams(), mrope_positions=positions, mrope_delta=0
    )


def test_layers_group_by_window_with_full_attention_first():
    layout = KVLayout.from_windows((8, 8, None, 8, 8, 8, None, 8))
    assert [g.window for g in layout.groups] == [None, 8]
    assert layout.groups[0].layers == (2, 6) and layout.groups[1].layers == (0, 1, 3, 4, 5, 7)
    assert layout.num_slots == 2  # gcd(2, 6): each page holds two layers
    assert layout.pages_per_block(0) == 1 and layout.pages_per_block(1) == 3
    assert layout.place(7).group == 1 and (layout.place(7).page, layout.place(7).slot) == (2, 1)
    assert len(layout.columns) == 4


def test_a_uniform_model_has_one_page_per_block_over_every_layer():
    layout = KVLayout.from_windows((None,) * 6)
    assert layout.num_slots == 6 and layout.columns == [(0, 0)] and KVLayout.uniform(6) == layout


def _windowed(num_pages: int = 64) -> KVCacheManager:
    """Block size 4; layer 0 global, layers 1-3 a window of 8 positions: 1 + 3 pages per block."""
    return KVCacheManager(num_pages, 4, layout=KVLayout.from_windows((None, 8, 8, 8)), max_chunk_tokens=8)


def _prefill(kv: KVCacheManager, request: Request) -> None:
    cached = kv.find_cached_prefix(request)
    assert kv.allocate(request, request.num_tokens - len(cached) * kv.block_size, cached)
    request.num_computed_tokens = request.num_tokens
    kv.cache_computed_blocks(request)


def test_sliding_pages_out_of_every_window_are_released_after_the_step():
    kv = _windowed()
    request = make_request("a", list(range(40)))  # 10 blocks
    _prefill(kv, request)
    sliding = kv.page_table(request, 1, 0, fill=None)
    # The next query sits at 40 and reads keys > 32: blocks 8 and 9 only.
    assert [b for b, page in enumerate(sliding) if page is not None] == [8, 9]
    assert None not in kv.page_table(request, 0, 0, fill=None)
    assert kv.pool.num_blocks - kv.pool.num_free_blocks == 10 + 2 * 3


def test_a_prefix_hit_needs_the_sliding_pages_of_its_last_window():
    kv = _windowed()
    first = make_request("a", list(range(40)))
    _prefill(kv, first)
    kv.free(first)  # every page back in the free queue, still cached
    again = make_request("b", [*range(40), 99])
    hit = kv.find_cached_prefix(again)
    assert len(hit) == 10 and [b for b, pages in enumerate(hit.tables[1]) if pages is not None] == [8, 9]
    # Eviction takes the never-used pages, then the sliding pages released during the step
    # (blocks 0-7): the hit does not need them.
    num_never_used = kv.pool.num_blocks - 10 - 10 * 3
    taken = kv.pool.allocate(num_never_used + 8 * 3)
    assert len(kv.find_cached_prefix(again)) == 10
    # Then block 9's sliding pages (the request freed its sliding pages first, tail first): every
    # shorter hit needs a window over blocks evicted already, so nothing is reusable.
    kv.pool.allocate(3)
    assert len(kv.find_cached_prefix(again)) == 0
    kv.pool.free(taken)


def test_admission_counts_only_a_window_and_a_chunk_of_sliding_pages():
    kv = _windowed()
    # 1000 tokens: 250 blocks of the global layer; a window (8) and a chunk (8) in 4 blocks, plus
    # one a window may straddle, for each of the 3 sliding pages.
    assert kv.pages_needed(1000) == 250 + 5 * 3
    assert KVCacheManager(64, 4).pages_needed(1000) == 250
