"""The cluster's counters summed over nodes so that a sum never goes down.

A plain sum over the live nodes drops when a node leaves (scale-in, a crash, a missed scrape),
and Prometheus' ``rate()`` reads that drop as a counter reset: a spike. Here each node's last
reading of a cumulative statistic stays in the sum after the node stops answering, and a node
whose reading went down (it restarted) keeps what it had counted before as an offset. Gauges
(queue depths, cache occupancy) are summed over the nodes that answered this scrape only.

Cumulative: a node's counters and histograms, as its Stats reply types them
(shared/node_metrics.py). Memory is bounded: a node silent for ``forget_after_s`` is folded into
one retired total per name.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from shared.node_metrics import HistogramValue, Snapshot

RETIRED = "(retired)"  # the address under which retired nodes' totals are reported


def _went_down(now: HistogramValue, before: HistogramValue) -> bool:
    return now.bounds != before.bounds or any(a < b for a, b in zip(now.cumulative, before.cumulative))


def _plus(total: HistogramValue | None, more: HistogramValue) -> HistogramValue:
    # Bounds that differ (a node restarted on a version with other buckets) cannot be added: the
    # newer reading alone is kept, the one case where a histogram's sum may go down.
    return more if total is None or total.bounds != more.bounds else total + more


@dataclass(slots=True)
class _Node:
    last: Snapshot = field(default_factory=Snapshot)
    offset: Snapshot = field(default_factory=Snapshot)  # counted before the node's restarts (counters, histograms)
    seen_s: float = 0.0

    def cumulative(self) -> Snapshot:
        """Counters and histograms, each with what the node counted before its restarts."""
        counters = {name: self.offset.counters.get(name, 0.0) + value for name, value in self.last.counters.items()}
        histograms = {name: _plus(self.offset.histograms.get(name), value) for name, value in self.last.histograms.items()}
        return Snapshot(counters, {}, histograms)


class ClusterSums:
    def __init__(self, *, forget_after_s: float = 3600.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.forget_after_s = forget_after_s
        self.clock = clock
        self._nodes: dict[str, _Node] = {}
        self._retired: dict[str, Snapshot] = {}  # role -> totals of its retired nodes

    def update(self, node_to_stats: Mapping[str, Snapshot]) -> dict[str, Snapshot]:
        """One scrape's readings ("role@address" -> metrics) -> "role@address" -> metrics to report,
        whose counters and histograms never decrease across scrapes. A departed node appears
        under its key (counters and histograms only) until it is retired, then in
        "role@(retired)"."""
        now = self.clock()
        for key, stats in node_to_stats.items():
            node = self._nodes.setdefault(key, _Node())
            last, offset = node.last, node.offset
            for name, value in stats.counters.items():
                previous = last.counters.get(name, 0.0)
                if value < previous:  # the node restarted: keep what it had counted
                    offset.counters[name] = offset.counters.get(name, 0.0) + previous
                last.counters[name] = value
            for name, value in stats.histograms.items():
                previous_histogram = last.histograms.get(name)
                if previous_histogram is not None and _went_down(value, previous_histogram):
                    offset.histograms[name] = _plus(offset.histograms.get(name), previous_histogram)
                last.histograms[name] = value
            last.gauges = dict(stats.gauges)
            node.seen_s = now
        self._retire(now)
        out = {}
        for key, node in self._nodes.items():
            reported = node.cumulative()
            if key in node_to_stats:
                reported.gauges = dict(node.last.gauges)
            out[key] = reported
        for role, totals in self._retired.items():
            out[f"{role}@{RETIRED}"] = Snapshot(dict(totals.counters), {}, dict(totals.histograms))
        return out

    def _retire(self, now: float) -> None:
        for key in [k for k, node in self._nodes.items() if now - node.seen_s > self.forget_after_s]:
            contribution = self._nodes.pop(key).cumulative()
            totals = self._retired.setdefault(key.partition("@")[0], Snapshot())
            for name, value in contribution.counters.items():
                totals.counters[name] = totals.counters.get(name, 0.0) + value
            for name, value in contribution.histograms.items():
                totals.histograms[name] = _plus(totals.histograms.get(name), value)
