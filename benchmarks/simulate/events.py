"""The simulation's virtual clock: pending events in a heap, run in time order (ties in the order
they were scheduled). Modelled compute advances this clock; the router's decisions and the index
calls made inside events are real and take wall time, which the clock does not see."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable


class EventQueue:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple]] = []
        self._order = itertools.count()
        self.num_run = 0

    def at(self, when: float, action: Callable[..., None], *args: object) -> None:
        """Run ``action(*args)`` at virtual time ``when`` (never before now)."""
        heapq.heappush(self._heap, (max(when, self.now), next(self._order), action, args))

    def after(self, delay_s: float, action: Callable[..., None], *args: object) -> None:
        self.at(self.now + delay_s, action, *args)

    def run(self, done: Callable[[], bool], *, max_events: int, max_time_s: float) -> bool:
        """Run events until ``done()``; False if the queue emptied or a bound was reached first."""
        while self._heap and not done():
            if self.num_run >= max_events or self._heap[0][0] > max_time_s:
                return False
            when, _, action, args = heapq.heappop(self._heap)
            self.now = when
            self.num_run += 1
            action(*args)
        return done()
