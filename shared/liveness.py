"""Proof that a node's working threads make progress, read by its heartbeat.

A heartbeat sent from a thread of its own proves only that this thread runs: a node whose compute
loop hangs (a deadlock, a stuck kernel, an event loop blocked by a bad call) would stay in every
router's rotation forever. So each loop that does the node's work registers a Watch, and the
heartbeat is sent only while every watch is healthy:

  * a work item (an engine step, an encode, a callback on the event loop) that has run for more
    than ``stall_s`` means the loop is stuck;
  * a loop that said it ticks at least every ``max_idle_s`` and has not ticked for that long, or
    whose thread died, is gone.

A node that stops heartbeating drops out of the index within its TTL, and the routers stop
choosing it. ``stall_s`` must exceed the longest legitimate work item (a long prefill step).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

DEFAULT_STALL_S = 60.0


@dataclass(slots=True)
class Watch:
    name: str
    clock: Callable[[], float]
    max_idle_s: float | None = None  # None: the loop may sleep for as long as it likes
    thread: threading.Thread | None = None
    busy_since: float | None = None
    last_tick: float = field(default=0.0)

    def tick(self) -> None:
        self.last_tick = self.clock()

    @contextmanager
    def busy(self) -> Iterator[None]:
        self.busy_since = self.clock()
        try:
            yield
        finally:
            self.busy_since = None
            self.last_tick = self.clock()

    def problem(self, stall_s: float) -> str | None:
        now = self.clock()
        if self.thread is not None and not self.thread.is_alive():
            return f"{self.name}: its thread has died"
        busy_since = self.busy_since
        if busy_since is not None and now - busy_since > stall_s:
            return f"{self.name}: one work item has run for {now - busy_since:.0f}s"
        if busy_since is None and self.max_idle_s is not None and now - self.last_tick > self.max_idle_s:
            return f"{self.name}: no tick for {now - self.last_tick:.0f}s"
        return None


class Liveness:
    def __init__(self, *, stall_s: float = DEFAULT_STALL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_s = stall_s
        self.clock = clock
        self._watches: list[Watch] = []

    def watch(self, name: str, *, max_idle_s: float | None = None, thread: threading.Thread | None = None) -> Watch:
        watch = Watch(name, self.clock, max_idle_s, thread, last_tick=self.clock())
        self._watches.append(watch)
        return watch

    def problems(self) -> list[str]:
        return [p for p in (w.problem(self.stall_s) for w in self._watches) if p is not None]

    def is_alive(self) -> bool:
        return not self.problems()
