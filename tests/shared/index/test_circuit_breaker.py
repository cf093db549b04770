"""The index's circuit breaker: opens after consecutive failures, fails fast while open, lets one
trial through after the cooldown, and closes again on success (pure logic, injected clock)."""

from __future__ import annotations

import pytest

from shared.index.circuit_breaker import BreakerIndex, CircuitBreaker
from shared.index.memory_backend import InProcessIndex
from shared.index.types import IndexUnavailableError
from tests.fake_clock import FakeClock


class FlakyIndex(InProcessIndex):
    """An in-process index that can be told to fail like an unreachable server."""

    def __init__(self) -> None:
        super().__init__(namespace="flaky")
        self.down = False
        self.num_calls = 0

    def lookup(self, mm_hashes, block_hashes):
        self.num_calls += 1
        if self.down:
            raise IndexUnavailableError("connection refused")
        return super().lookup(mm_hashes, block_hashes)


def test_breaker_states():
    clock = FakeClock()
    breaker = CircuitBreaker(failure_threshold=2, cooldown_s=5, clock=clock)
    assert breaker.state == "closed" and breaker.can_call()
    breaker.record_failure()
    assert breaker.state == "closed"  # one failure is not a pattern
    breaker.record_failure()
    assert breaker.state == "open" and not breaker.can_call()
    clock.now += 5
    assert breaker.state == "half-open" and breaker.can_call()
    assert not breaker.can_call()  # one trial at a time
    breaker.record_failure()  # the trial failed: open again for a full cooldown
    assert breaker.state == "open"
    clock.now += 5
    assert breaker.can_call()
    breaker.record_success()
    assert breaker.state == "closed" and breaker.num_rejected == 2


def test_an_open_breaker_fails_calls_without_reaching_the_index_and_recovers():
    clock, inner = FakeClock(), FlakyIndex()
    index = BreakerIndex(inner, CircuitBreaker(failure_threshold=3, cooldown_s=2, clock=clock))
    inner.down = True
    for _ in range(3):
        with pytest.raises(IndexUnavailableError, match="connection refused"):
            index.lookup([], [])
    for _ in range(10):
        with pytest.raises(IndexUnavailableError, match="skipped"):
            index.lookup([], [])
    assert inner.num_calls == 3  # the ten calls cost nothing
    inner.down = False
    clock.now += 2
    assert index.lookup([], []).node_to_num_prefix_blocks == {}  # the trial succeeds
    assert index.breaker.state == "closed" and inner.num_calls == 4


def test_breaker_settings_are_checked():
    with pytest.raises(ValueError):
        CircuitBreaker(failure_threshold=0)
