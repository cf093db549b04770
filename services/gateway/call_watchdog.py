"""Cancels calls to nodes that left the cluster, so the pipeline fails them over at once.

A node that hangs (a stuck engine step, a blocked event loop) keeps its TCP connections and
answers HTTP/2 keepalive pings from gRPC's own threads, so a call to it would simply wait until
its deadline. Its heartbeat, though, stops (shared/liveness.py) and its record lapses from the
index. Every ``interval_s`` the watchdog looks up the nodes of the calls in flight in the
membership; a call whose node is gone is cancelled, which the pipeline treats as that node's
failure (a retry, or a decode stream's migration).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from services.router.membership import Membership


class Cancellable(Protocol):
    def cancel(self) -> bool | None: ...


class CallWatchdog:
    def __init__(self, membership: Membership, *, interval_s: float = 1.0) -> None:
        self.membership = membership
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._call_to_address: dict[int, tuple[Cancellable, str]] = {}
        self._thread: threading.Thread | None = None
        self.num_cancelled = 0

    @contextmanager
    def watching(self, call: Cancellable, address: str) -> Iterator[None]:
        if self.membership.index is None:  # static lists: no liveness to watch
            yield
            return
        with self._lock:
            self._call_to_address[id(call)] = (call, address)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="call-watchdog", daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._call_to_address.pop(id(call), None)

    def check(self) -> None:
        with self._lock:
            calls = list(self._call_to_address.values())
        for call, address in calls:
            if self.membership.find(address) is None:
                self.num_cancelled += 1
                call.cancel()

    def _run(self) -> None:
        while True:
            threading.Event().wait(self.interval_s)
            self.check()
