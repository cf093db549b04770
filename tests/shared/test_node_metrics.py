"""Metrics declared once in a record: names checked at declaration, values read into one typed
snapshot, histograms bucketed and added, parts' records nested and summed."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from shared.node_metrics import Counter, Gauge, Histogram, HistogramValue, counter, gauge, histogram, metrics_of, snapshot


@dataclass(slots=True)
class PartMetrics:
    num_drops: Counter = counter("part_drops_total", "Messages the part dropped")


@dataclass(slots=True)
class NodeMetrics:
    part: PartMetrics
    num_requests: Counter = counter("node_requests_total", "Requests served")
    depth: Gauge = gauge("node_depth", "Calls waiting")
    queue_time: Histogram = histogram("queue_seconds", "A call's wait", (0.1, 1.0))
    by_reason: dict[str, Counter] = field(default_factory=lambda: {"stale": Counter("node_stale_total", "Stale records")})
    tower: PartMetrics | None = None  # a part this node does not have


def test_names_say_their_kind():
    with pytest.raises(ValueError):
        Counter("node_requests", "no _total")
    with pytest.raises(ValueError):
        Gauge("node_depth_total", "a gauge named like a counter")
    with pytest.raises(ValueError):
        Histogram("queue_seconds_count", "a histogram named like one of its series")
    for bounds in ((), (1.0, 0.5), (0.5, 0.5), (1.0, float("inf"))):
        with pytest.raises(ValueError):
            Histogram("queue_seconds", "bad bounds", bounds)


def test_each_record_gets_its_own_metrics():
    first, second = NodeMetrics(PartMetrics()), NodeMetrics(PartMetrics())
    first.num_requests.inc()
    assert (first.num_requests.value, second.num_requests.value) == (1.0, 0.0)


def test_a_snapshot_reads_every_metric_of_a_record_and_its_parts_by_kind():
    metrics = NodeMetrics(PartMetrics())
    metrics.num_requests.inc(3)
    metrics.part.num_drops.inc()
    metrics.by_reason["stale"].inc(2)
    waiting = [4]
    metrics.depth.read_from(lambda: waiting[0])
    for seconds in (0.05, 0.1, 0.5, 7.0):
        metrics.queue_time.observe(seconds)
    stats = snapshot(metrics)
    assert stats.counters == {"node_requests_total": 3.0, "part_drops_total": 1.0, "node_stale_total": 2.0}
    assert stats.gauges == {"node_depth": 4.0}
    assert stats.histograms == {"queue_seconds": HistogramValue((0.1, 1.0), (2.0, 3.0, 4.0), 7.65)}
    assert stats.help["node_depth"] == "Calls waiting"
    waiting[0] = 1
    assert snapshot(metrics).gauges == {"node_depth": 1.0}  # read at snapshot time
    assert len(list(metrics_of(metrics))) == 5  # the absent part (None) has none


def test_a_counter_read_from_its_owner_is_not_incremented_here():
    owned = [5]
    total = Counter("engine_aborted_total", "Counted by the engine")
    total.read_from(lambda: owned[0])
    assert total.value == 5.0
    with pytest.raises(ValueError):
        total.inc()
    with pytest.raises(ValueError):
        Counter("x_total", "only up").inc(-1)


def test_same_named_metrics_of_several_records_are_summed_and_kinds_must_agree():
    first, second = NodeMetrics(PartMetrics()), NodeMetrics(PartMetrics())
    first.num_requests.inc(2)
    second.num_requests.inc(5)
    first.queue_time.observe(0.5)
    second.queue_time.observe(2.0)
    stats = snapshot(first, second)
    assert stats.counters["node_requests_total"] == 7.0
    assert stats.histograms["queue_seconds"] == HistogramValue((0.1, 1.0), (0.0, 1.0, 2.0), 2.5)

    @dataclass(slots=True)
    class Clash:
        queue_time: Gauge = gauge("queue_seconds", "a gauge named like the histogram")

    with pytest.raises(ValueError):
        snapshot(first, Clash())


def test_histogram_values_add_only_over_the_same_bounds_and_render_prometheus_buckets():
    value = HistogramValue((0.1, 1.0), (1.0, 2.0, 3.0), 4.5)
    assert (value + value).cumulative == (2.0, 4.0, 6.0) and (value + value).count == 6.0
    assert value.buckets() == [("0.1", 1.0), ("1.0", 2.0), ("+Inf", 3.0)]
    with pytest.raises(ValueError):
        value + HistogramValue((0.5,), (1.0, 1.0), 0.1)
    with pytest.raises(ValueError):
        HistogramValue((0.1,), (1.0,), 0.0)  # a count per bound and one for +Inf


def test_a_record_holds_only_metrics_and_records():
    @dataclass(slots=True)
    class Loose:
        name: str = "not a metric"

    with pytest.raises(TypeError):
        snapshot(Loose())


def test_counts_from_many_threads_are_all_kept():
    total = Counter("hits_total", "Hits")
    timing = Histogram("t_seconds", "Times", (1.0,))

    def work() -> None:
        for _ in range(10_000):
            total.inc()
            timing.observe(0.5)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert total.value == 40_000.0 and timing.value.count == 40_000.0
