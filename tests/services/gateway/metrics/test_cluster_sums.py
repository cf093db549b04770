"""Cluster sums that never decrease (pure logic): counters and histograms are cumulative, gauges
are not, as each node's typed Stats reply says."""

from __future__ import annotations

from services.gateway.metrics.cluster_sums import RETIRED, ClusterSums
from shared.node_metrics import HistogramValue, Snapshot


def stats(total: float, gauge: float | None = None) -> Snapshot:
    return Snapshot({"x_total": total}, {} if gauge is None else {"gauge": gauge})


def queue(*cumulative: float, total: float) -> HistogramValue:
    return HistogramValue((0.1,), cumulative, total)


def test_departed_nodes_keep_their_counts_and_are_retired_into_one_total_per_role():
    now = [0.0]
    sums = ClusterSums(forget_after_s=10.0, clock=lambda: now[0])
    sums.update({"decode@a": stats(5.0, 1.0), "decode@b": stats(7.0, 2.0)})
    now[0] = 5.0
    reported = sums.update({"decode@a": stats(6.0, 1.0)})
    assert reported == {"decode@a": stats(6.0, 1.0), "decode@b": stats(7.0, None)}  # b's gauge goes with it
    now[0] = 20.0
    reported = sums.update({"decode@a": stats(6.0, 1.0)})
    assert reported == {"decode@a": stats(6.0, 1.0), f"decode@{RETIRED}": stats(7.0, None)}


def test_a_restarted_node_adds_to_what_it_had_counted():
    sums = ClusterSums()
    sums.update({"prefill@a": stats(40.0)})
    assert sums.update({"prefill@a": stats(2.0)}) == {"prefill@a": stats(42.0)}
    assert sums.update({"prefill@a": stats(5.0)}) == {"prefill@a": stats(45.0)}


def test_histograms_are_cumulative_across_restarts_and_retirement():
    now = [0.0]
    sums = ClusterSums(forget_after_s=10.0, clock=lambda: now[0])
    sums.update({"prefill@a": Snapshot(histograms={"queue_seconds": queue(3.0, 4.0, total=2.0)})})
    # Restarted: fewer observations than before. What it had counted stays in.
    reported = sums.update({"prefill@a": Snapshot(histograms={"queue_seconds": queue(1.0, 1.0, total=0.05)})})
    assert reported["prefill@a"].histograms == {"queue_seconds": queue(4.0, 5.0, total=2.05)}
    now[0] = 20.0
    reported = sums.update({})
    assert reported == {f"prefill@{RETIRED}": Snapshot(histograms={"queue_seconds": queue(4.0, 5.0, total=2.05)})}


def test_a_histogram_whose_bounds_changed_is_reported_as_its_node_now_has_it():
    sums = ClusterSums()
    sums.update({"prefill@a": Snapshot(histograms={"queue_seconds": queue(3.0, 4.0, total=2.0)})})
    rebucketed = HistogramValue((0.5, 1.0), (1.0, 1.0, 1.0), 0.2)
    reported = sums.update({"prefill@a": Snapshot(histograms={"queue_seconds": rebucketed})})
    assert reported["prefill@a"].histograms == {"queue_seconds": rebucketed}
