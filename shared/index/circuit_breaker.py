"""A circuit breaker in front of the index, so a hung or dead Redis costs requests nothing
after the first few calls that find it so.

States: closed (calls go through) -> after ``failure_threshold`` consecutive failures, open for
``cooldown_s`` (every call fails at once with IndexUnavailableError, without touching the
network) -> half-open (the next call is a trial: success closes the breaker, failure opens it for
another cooldown). Callers already treat IndexUnavailableError as "no index right now" (the router
routes without cache lookups, the membership keeps its last-known nodes, publishers retry), so an
open breaker only changes how long each such call takes: nothing instead of a timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from shared.index.backend import CacheIndex
from shared.index.types import IndexEvents, IndexUnavailableError, LookupResult, MembershipChanges, NodeInfo, NodeState
from shared.types import BlockHash, MmHash

T = TypeVar("T")


class CircuitBreaker:
    def __init__(self, *, failure_threshold: int = 3, cooldown_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        if failure_threshold < 1 or cooldown_s <= 0:
            raise ValueError("failure_threshold must be >= 1 and cooldown_s positive")
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._num_consecutive_failures = 0
        self._open_until: float | None = None
        self._trial_in_flight = False
        self.num_rejected = 0

    @property
    def state(self) -> str:
        with self._lock:
            if self._open_until is None:
                return "closed"
            return "open" if self._clock() < self._open_until else "half-open"

    def can_call(self) -> bool:
        """Whether a call may go through now (in half-open, only one trial at a time)."""
        with self._lock:
            if self._open_until is None:
                return True
            if self._clock() < self._open_until or self._trial_in_flight:
                self.num_rejected += 1
                return False
            self._trial_in_flight = True
            return True

    def check(self) -> None:
        """Raise IndexUnavailableError unless a call may go through now (``can_call``)."""
        if not self.can_call():
            raise IndexUnavailableError(f"the index is failing; calls are skipped for up to {self.cooldown_s:g}s")

    def record_success(self) -> None:
        with self._lock:
            self._num_consecutive_failures, self._open_until, self._trial_in_flight = 0, None, False

    def record(self, error: BaseException | None) -> None:
        """A call's outcome: IndexUnavailableError is the index failing; any other error is the
        index answering (with an error about the call), so it is reachable."""
        if isinstance(error, IndexUnavailableError):
            self.record_failure()
        else:
            self.record_success()

    def record_failure(self) -> None:
        with self._lock:
            self._num_consecutive_failures += 1
            if self._trial_in_flight or self._num_consecutive_failures >= self.failure_threshold:
                self._open_until = self._clock() + self.cooldown_s
            self._trial_in_flight = False


class BreakerIndex:
    """A CacheIndex whose calls fail fast while its breaker is open."""

    def __init__(self, inner: CacheIndex, breaker: CircuitBreaker | None = None) -> None:
        self.inner = inner
        self.breaker = breaker or CircuitBreaker()

    def register_node(self, node: NodeInfo, *, ttl_s: float, seal_fn: Callable[[int], str] | None = None) -> int:
        return self._call(lambda: self.inner.register_node(node, ttl_s=ttl_s, seal_fn=seal_fn))

    def heartbeat(
        self,
        node_id: str,
        epoch: int,
        *,
        load: float,
        kv_usage: float,
        ttl_s: float,
        seal: str = "",
        adapters: frozenset[str] = frozenset(),
    ) -> bool:
        return self._call(
            lambda: self.inner.heartbeat(node_id, epoch, load=load, kv_usage=kv_usage, ttl_s=ttl_s, seal=seal, adapters=adapters)
        )

    def deregister_node(self, node_id: str, epoch: int) -> None:
        self._call(lambda: self.inner.deregister_node(node_id, epoch))

    def live_nodes(self) -> dict[str, NodeState]:
        return self._call(self.inner.live_nodes)

    def membership_changes(self, since: int) -> MembershipChanges | None:
        return self._call(lambda: self.inner.membership_changes(since))

    def publish(self, node_id: str, epoch: int, events: IndexEvents) -> None:
        self._call(lambda: self.inner.publish(node_id, epoch, events))

    def lookup(self, mm_hashes: list[MmHash], block_hashes: list[BlockHash]) -> LookupResult:
        return self._call(lambda: self.inner.lookup(mm_hashes, block_hashes))

    def close(self) -> None:
        self.inner.close()

    def _call(self, fn: Callable[[], T]) -> T:
        self.breaker.check()
        try:
            result = fn()
        except BaseException as exc:
            self.breaker.record(exc)
            raise
        self.breaker.record(None)
        return result
