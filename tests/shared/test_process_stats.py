"""Process-wide metrics sources: summed by name while they live, forgotten once dropped."""

from __future__ import annotations

import gc
from dataclasses import dataclass

from shared import process_stats
from shared.node_metrics import Counter, counter


@dataclass(slots=True)
class ProbeMetrics:
    num_widgets: Counter = counter("probe_widgets_total", "Widgets probed")


class Source:
    def __init__(self, value: float) -> None:
        self.metrics = ProbeMetrics()
        self.metrics.num_widgets.inc(value)


def test_live_sources_are_summed_with_the_nodes_records_and_dropped_ones_forgotten():
    before = process_stats.node_snapshot().counters.get("probe_widgets_total", 0.0)
    first, second = Source(2.0), Source(3.0)
    process_stats.register(first)
    process_stats.register(second)
    own = ProbeMetrics()
    own.num_widgets.inc(10.0)
    assert process_stats.node_snapshot(own).counters["probe_widgets_total"] == before + 15.0
    del second
    gc.collect()
    assert process_stats.node_snapshot().counters["probe_widgets_total"] == before + 2.0
