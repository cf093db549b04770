"""Open-loop arrival times: a fixed seed fixes them, their mean gap is 1/rate, and burstiness
shapes their spread as a gamma distribution's shape does."""

from __future__ import annotations

import statistics

import pytest

from services.bench.arrivals import arrival_offsets


def _gaps(offsets: list[float]) -> list[float]:
    return [b - a for a, b in zip(offsets, offsets[1:])]


def test_a_closed_loop_sends_everything_at_once():
    assert arrival_offsets(5, None) == [0.0] * 5


def test_a_seed_fixes_the_schedule_and_the_mean_gap_is_one_over_the_rate():
    offsets = arrival_offsets(4000, 20.0, seed=3)
    assert offsets == arrival_offsets(4000, 20.0, seed=3) and offsets != arrival_offsets(4000, 20.0, seed=4)
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    assert statistics.fmean(_gaps(offsets)) == pytest.approx(1 / 20.0, rel=0.05)


def test_burstiness_sets_the_spread_of_the_gaps():
    # A gamma(k) gap has a coefficient of variation of 1/sqrt(k): 1 for Poisson, 2 at k = 0.25.
    for burstiness, cv in ((1.0, 1.0), (0.25, 2.0), (4.0, 0.5)):
        gaps = _gaps(arrival_offsets(6000, 10.0, burstiness=burstiness, seed=1))
        assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.08), burstiness
        assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(cv, rel=0.1), burstiness


def test_bad_rates_and_burstiness_are_refused():
    with pytest.raises(ValueError, match="rate must be positive"):
        arrival_offsets(3, 0.0)
    with pytest.raises(ValueError, match="burstiness"):
        arrival_offsets(3, 1.0, burstiness=0.0)
