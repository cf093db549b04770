"""Cancels calls to nodes that left the cluster, so the pipeline fails them over at once.

A node that hangs (a stuck engine step, a blocked event loop) keeps its TCP connections and
answers HTTP/2 keepalive pings from gRPC's own threads, so a call to it would simply wait until
its deadline. Its heartbeat, though, stops (shared/liveness.py) and its record lapses from the
index. Every ``interval_s`` the watchdog (a task on the gateway's event loop, started with the
first watched call) looks up the nodes of the calls in flight in the membership; a call whose
node is gone is cancelled. The awaiting code sees asyncio.CancelledError, and the ``Watch`` tells
it apart from its own task's cancellation (the client going away): only the former is the node's
failure (a retry, or a decode stream's migration).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from services.router.membership import Membership


class Cancellable(Protocol):
    def cancel(self) -> bool | None: ...


@dataclass(slots=True)
class Watch:
    call: Cancellable
    address: str
    fired: bool = False  # the watchdog cancelled the call: its node left

    def fired_alone(self) -> bool:
        """The watchdog cancelled the call and nobody cancelled the task awaiting it."""
        task = asyncio.current_task()
        return self.fired and (task is None or not task.cancelling())


class CallWatchdog:
    def __init__(self, membership: Membership, *, interval_s: float = 1.0) -> None:
        self.membership = membership
        self.interval_s = interval_s
        self._id_to_watch: dict[int, Watch] = {}
        self._task: asyncio.Task | None = None
        self.num_cancelled = 0

    @contextmanager
    def watching(self, call: Cancellable, address: str) -> Iterator[Watch]:
        watch = Watch(call, address)
        if self.membership.index is None:  # static lists: no liveness to watch
            yield watch
            return
        self._id_to_watch[id(watch)] = watch
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="call-watchdog")
        try:
            yield watch
        finally:
            self._id_to_watch.pop(id(watch), None)

    def check(self) -> None:
        for watch in list(self._id_to_watch.values()):
            if not watch.fired and self.membership.find(watch.address) is None:
                self.num_cancelled += 1
                watch.fired = True
                watch.call.cancel()

    async def _run(self) -> None:
        while self._id_to_watch:  # ends when nothing is watched; the next watched call restarts it
            await asyncio.sleep(self.interval_s)
            self.check()
