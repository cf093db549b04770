"""One thread for all of a process's tensor work.

Why: each thread that runs a parallel torch op gets its own OpenMP team. Once a process has more
OpenMP threads than cores (two teams on a 2-core machine), libgomp throttles its spin-waiting,
and every small op then pays a futex wake-up, many times the op itself and a large share of a
small-model decode step (docs/benchmarks.md, "Measurements behind code comments"). So servers
build their models on, and run every forward pass from, one dedicated thread; asyncio and gRPC
threads only move bytes. The engine loop (services/engine/engine_loop.py) is such a thread;
ComputeThread is the same idea for request/response work such as the encoder's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from shared.liveness import Liveness

T = TypeVar("T")


class ComputeThread:
    def __init__(self, name: str, *, liveness: Liveness | None = None) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._watch = liveness.watch(name) if liveness is not None else None

    def run(self, fn: Callable[..., T], *args) -> T:
        """Run ``fn(*args)`` on the compute thread and wait for it (calls run one at a time)."""
        return self._executor.submit(self._watched, fn, *args).result()

    def submit(self, fn: Callable[..., T], *args) -> Future:
        """Queue ``fn(*args)`` on the compute thread without waiting: work that only has to run
        before the calls queued after it."""
        return self._executor.submit(self._watched, fn, *args)

    async def call(self, fn: Callable[..., T], *args) -> T:
        """``run`` for an event loop: awaits ``fn(*args)`` on the compute thread without holding
        a thread of the loop's own."""
        return await asyncio.wrap_future(self._executor.submit(self._watched, fn, *args))

    def _watched(self, fn: Callable[..., T], *args) -> T:
        if self._watch is None:
            return fn(*args)
        with self._watch.busy():
            return fn(*args)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
