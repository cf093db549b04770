"""The embeddings suite counts every request (a failure is never answered, in the latency
percentiles, and not in the throughput), and compares both servers' vectors."""

from __future__ import annotations

import math

from benchmarks.suites.embeddings import _agreement, _summary


def test_every_request_counts_and_a_failure_is_never_answered():
    outcomes = [(200, 0.5, [1.0]), (200, 1.0, [1.0]), (500, 0.01, None), (429, 0.01, None)]
    summary = _summary(outcomes, wall_s=2.0)
    assert (summary["num_sent"], summary["num_answered"], summary["failed_statuses"]) == (4, 2, [429, 500])
    assert summary["throughput_rps"] == 1.0  # answered requests per second of wall time
    assert summary["latency_p50_ms"] == 1000.0 and summary["latency_p90_ms"] is None


def test_agreement_is_over_the_inputs_both_answered():
    ours = [[1.0, 0.0], [0.6, 0.8], None]
    theirs = [[1.0, 0.0], [0.8, 0.6], [1.0, 0.0]]
    agreement = _agreement(ours, theirs)
    assert agreement["num_compared"] == 2 and math.isclose(agreement["max_abs_diff"], 0.2)
    assert math.isclose(agreement["min_cosine"], 0.96)
    assert _agreement([None], [None]) == {"num_compared": 0}
