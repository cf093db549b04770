"""Cache gauges: the name pair a node declares per cache, and reading the pairs back."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from shared.cache_gauges import CacheGauges, CacheUsage, cache_gauges, cache_usage
from shared.node_metrics import snapshot


@dataclass(slots=True)
class Caches:
    kv: CacheGauges = cache_gauges("kv", "blocks")
    memo: CacheGauges = cache_gauges("file_hash_memo", "entries")


def test_a_cache_declares_used_and_capacity_under_its_unit_read_at_snapshot_time():
    caches = Caches()
    used = [3]
    caches.kv.read_from(lambda: used[0], lambda: 12)
    assert snapshot(caches).gauges == {
        "kv_cache_used_blocks": 3.0,
        "kv_cache_capacity_blocks": 12.0,
        "file_hash_memo_cache_used_entries": 0.0,
        "file_hash_memo_cache_capacity_entries": 0.0,
    }
    used[0] = 5
    assert snapshot(caches).gauges["kv_cache_used_blocks"] == 5.0


def test_unknown_units_are_refused():
    with pytest.raises(ValueError):
        cache_gauges("processor", "megabytes")


def test_pairs_are_read_back_and_other_gauges_ignored():
    caches = Caches()
    caches.kv.read_from(lambda: 3, lambda: 12)
    gauges = {
        **snapshot(caches).gauges,
        "processor_cache_bytes": 5.0,  # an older gauge with no capacity beside it
        "encoder_cache_used_rows": 7.0,  # no capacity: not a pair
    }
    assert cache_usage(gauges) == [CacheUsage("file_hash_memo", "entries", 0.0, 0.0), CacheUsage("kv", "blocks", 3.0, 12.0)]
    assert cache_usage(gauges)[1].fraction == 0.25
    assert cache_usage(gauges)[0].fraction == 0.0  # disabled cache: no budget, nothing used
