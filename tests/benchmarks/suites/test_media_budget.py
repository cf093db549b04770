"""The media-budget suite counts every request: a refusal is a request never answered, in the
TTFT percentiles and in the goodput alike."""

from __future__ import annotations

from benchmarks.suites.media_budget import _summary


def test_every_request_counts_and_a_refusal_is_never_answered():
    outcomes = [(200, 0.5), (200, 1.0), (429, 0.01), (429, 0.01), (413, 0.01), (200, 9.0)]
    summary = _summary(outcomes, slo_s=5.0)
    assert (summary["num_sent"], summary["num_answered"], summary["num_429"], summary["num_413"], summary["num_other"]) == (6, 3, 2, 1, 0)
    assert summary["ttft_p50_ms"] == 9000.0  # the third of six: 0.5, 1.0, 9.0, then the refusals
    assert summary["ttft_p90_ms"] is None  # a refused request
    assert summary["goodput"] == 2 / 6  # answered within 5 s, of all sent


def test_all_answered_gives_plain_percentiles_and_no_traffic_gives_none():
    summary = _summary([(200, 0.1 * i) for i in range(1, 11)], slo_s=0.5)
    assert summary["ttft_p50_ms"] == 500.0 and summary["ttft_p90_ms"] == 900.0 and summary["goodput"] == 0.5
    assert _summary([], slo_s=1.0)["goodput"] is None
