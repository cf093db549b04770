"""A histogram flattened into a node's Stats map and read back."""

from __future__ import annotations

import pytest

from shared.flat_histogram import FlatHistogram, HistogramSample, histogram_samples


def test_counts_are_cumulative_with_sum_and_count():
    histogram = FlatHistogram("queue_seconds", (0.1, 1.0))
    for seconds in (0.05, 0.1, 0.5, 3.0):
        histogram.observe(seconds)
    assert histogram.counters() == {
        "queue_seconds_bucket_le_0.1": 2.0,
        "queue_seconds_bucket_le_1.0": 3.0,
        "queue_seconds_bucket_le_inf": 4.0,
        "queue_seconds_sum": 3.65,
        "queue_seconds_count": 4.0,
    }


def test_samples_are_split_out_of_a_stats_map_and_add_up():
    histogram = FlatHistogram("queue_seconds", (0.1,))
    histogram.observe(0.2)
    samples, rest = histogram_samples({**histogram.counters(), "requests_total": 7.0, "kv_cache_used_blocks": 3.0})
    assert rest == {"requests_total": 7.0, "kv_cache_used_blocks": 3.0}
    sample = samples["queue_seconds"]
    assert sample.sorted_buckets() == [("0.1", 0.0), ("+Inf", 1.0)] and sample.sum == 0.2
    total = HistogramSample()
    total.add(sample)
    total.add(sample)
    assert total.sorted_buckets() == [("0.1", 0.0), ("+Inf", 2.0)] and total.sum == 0.4


def test_bounds_must_ascend():
    with pytest.raises(ValueError):
        FlatHistogram("h", (1.0, 0.5))
