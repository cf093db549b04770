"""Cache gauges: the name pair a node exports per cache, and reading the pairs back."""

from __future__ import annotations

import pytest

from shared.cache_gauges import CacheUsage, cache_gauges, cache_usage


def test_a_cache_exports_used_and_capacity_under_its_unit():
    assert cache_gauges("processor", "bytes", 10, 64) == {"processor_cache_used_bytes": 10.0, "processor_cache_capacity_bytes": 64.0}


def test_unknown_units_are_refused():
    with pytest.raises(ValueError):
        cache_gauges("processor", "megabytes", 1, 2)


def test_pairs_are_read_back_and_other_statistics_ignored():
    stats = {
        **cache_gauges("kv", "blocks", 3, 12),
        **cache_gauges("file_hash_memo", "entries", 0, 0),
        "processor_cache_bytes": 5.0,  # an older gauge with no capacity beside it
        "encoder_cache_used_rows": 7.0,  # no capacity: not a pair
        "prefill_tokens_computed_total": 99.0,
    }
    assert cache_usage(stats) == [CacheUsage("file_hash_memo", "entries", 0.0, 0.0), CacheUsage("kv", "blocks", 3.0, 12.0)]
    assert cache_usage(stats)[1].fraction == 0.25
    assert cache_usage(stats)[0].fraction == 0.0  # disabled cache: no budget, nothing used
