"""Process-wide counter sources: summed by name while they live, forgotten once dropped."""

from __future__ import annotations

import gc

from shared import process_stats


class Source:
    def __init__(self, value: float) -> None:
        self.value = value

    def counters(self) -> dict[str, float]:
        return {"probe_widgets_total": self.value}


def test_live_sources_are_summed_and_dropped_ones_forgotten():
    before = process_stats.process_counters().get("probe_widgets_total", 0.0)
    first, second = Source(2.0), Source(3.0)
    process_stats.register(first)
    process_stats.register(second)
    assert process_stats.process_counters()["probe_widgets_total"] == before + 5.0
    del second
    gc.collect()
    assert process_stats.process_counters()["probe_widgets_total"] == before + 2.0
