"""The cluster's counters summed over nodes so that a sum never goes down.

A plain sum over the live nodes drops when a node leaves (scale-in, a crash, a missed scrape),
and Prometheus' ``rate()`` reads that drop as a counter reset: a spike. Here each node's last
reading of a cumulative statistic stays in the sum after the node stops answering, and a node
whose reading went down (it restarted) keeps what it had counted before as an offset. Gauges
(queue depths, cache occupancy) are summed over the nodes that answered this scrape only.

Cumulative: names ending ``_total``, and a flattened histogram's ``_bucket_le_*``, ``_sum`` and
``_count`` (shared/flat_histogram.py). Memory is bounded: a node silent for ``forget_after_s``
is folded into one retired total per name.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

_CUMULATIVE = re.compile(r"(_total|_bucket_le_[^_]+|_sum|_count)$")
RETIRED = "(retired)"  # the address under which retired nodes' totals are reported


def is_cumulative(name: str) -> bool:
    return _CUMULATIVE.search(name) is not None


@dataclass(slots=True)
class _Node:
    last: dict[str, float] = field(default_factory=dict)
    offset: dict[str, float] = field(default_factory=dict)  # counted before the node's restarts
    seen_s: float = 0.0

    def contribution(self, name: str) -> float:
        return self.offset.get(name, 0.0) + self.last.get(name, 0.0)


class ClusterSums:
    def __init__(self, *, forget_after_s: float = 3600.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.forget_after_s = forget_after_s
        self.clock = clock
        self._nodes: dict[str, _Node] = {}
        self._retired: dict[str, dict[str, float]] = {}  # role -> name -> total of retired nodes

    def update(self, node_to_stats: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
        """One scrape's readings ("role@address" -> statistics) -> "role@address" -> statistics to
        report, whose cumulative ones never decrease across scrapes. A departed node appears
        under its key (cumulative statistics only) until it is retired, then in
        "role@(retired)"."""
        now = self.clock()
        for key, stats in node_to_stats.items():
            node = self._nodes.setdefault(key, _Node())
            for name, value in stats.items():
                if is_cumulative(name):
                    previous = node.last.get(name, 0.0)
                    if value < previous:  # the node restarted: keep what it had counted
                        node.offset[name] = node.offset.get(name, 0.0) + previous
                node.last[name] = value
            node.seen_s = now
        self._retire(now)
        out = {}
        for key, node in self._nodes.items():
            live = key in node_to_stats
            out[key] = {
                name: node.contribution(name) if is_cumulative(name) else value
                for name, value in node.last.items()
                if live or is_cumulative(name)
            }
        for role, totals in self._retired.items():
            out[f"{role}@{RETIRED}"] = dict(totals)
        return out

    def _retire(self, now: float) -> None:
        for key in [k for k, node in self._nodes.items() if now - node.seen_s > self.forget_after_s]:
            node = self._nodes.pop(key)
            totals = self._retired.setdefault(key.partition("@")[0], {})
            for name in node.last:
                if is_cumulative(name):
                    totals[name] = totals.get(name, 0.0) + node.contribution(name)
