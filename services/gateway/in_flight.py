"""One request's gRPC calls in flight, so that whoever serves its client can cancel them at once.

A request's pipeline runs on a thread of its own and blocks inside its current call (a prefill
can take seconds). When the client goes away, waiting for that call to return before stopping
would let the prefill node finish a prompt nobody reads, and ship its KV. Cancelling the call
instead ends it on the node too: its servicer is cancelled and aborts the engine request. The
pipeline then stops, without blaming the node or retrying.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from services.gateway.call_watchdog import Cancellable


class RequestCancelledError(Exception):
    """The request's client went away; its calls were cancelled and nothing is retried."""


class InFlightCalls:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[int, Cancellable] = {}
        self.cancelled = False

    @contextmanager
    def tracking(self, call: Cancellable) -> Iterator[None]:
        """Track ``call`` while it runs; one started after ``cancel`` is cancelled at once."""
        with self._lock:
            self._calls[id(call)] = call
            cancelled = self.cancelled
        if cancelled:
            call.cancel()
        try:
            yield
        finally:
            with self._lock:
                self._calls.pop(id(call), None)

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            calls = list(self._calls.values())
        for call in calls:
            call.cancel()
