"""Calls handed from other threads to one asyncio loop, with one wake-up per burst.

``loop.call_soon_threadsafe`` writes to the loop's self-pipe on every call. A decode step hands
the loop one output per running request (hundreds), and each write could wake the loop thread to
contend for the GIL with the engine thread that is still delivering. Here the calls queue under
a lock, and only the call that finds the queue empty wakes the loop, which then runs the whole
burst in order. Calls run in the order they were handed over, so a request's outputs stay in
order.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("tessera.loop_handoff")


class LoopHandoff:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[Callable[[Any], None], Any]] = []

    def call(self, fn: Callable[[Any], None], arg: Any) -> None:
        """Run ``fn(arg)`` on the loop soon; callable from any thread."""
        with self._lock:
            wake = not self._pending
            self._pending.append((fn, arg))
        if wake:
            self.loop.call_soon_threadsafe(self._run_pending)

    def _run_pending(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        for fn, arg in batch:
            try:
                fn(arg)
            except Exception:  # one failing call must not drop the burst's others
                log.exception("handed-off call failed")
