"""Runs an Engine on its own thread, for servers.

The engine is single-threaded by design. Servers talk to it only through ``call`` (run a function
on the loop thread between steps, get a concurrent Future) and ``subscribe`` (receive a request's
outputs). The loop: run pending calls -> one engine step if work exists and its pacing allows ->
deliver outputs -> otherwise sleep until a call arrives (or the next step is due). A step that
scheduled nothing (every request awaits embeddings not imported yet) is not retried at once:
the loop waits for a call first, briefly.

The engine is built on the loop thread too, so that one thread does all of the process's tensor
work (see shared/compute_thread.py for why that matters on CPU).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from services.engine.engine import Engine
from services.engine.output_processor import RequestOutput
from shared.liveness import Liveness

T = TypeVar("T")
log = logging.getLogger("tessera.engine")
OutputCallback = Callable[[RequestOutput | BaseException], None]
# How long a loop whose last step scheduled nothing waits for a call before stepping again.
STALLED_RETRY_S = 0.05


class EngineLoop:
    def __init__(
        self,
        make_engine: Callable[[], Engine],
        *,
        after_step: Callable[[Engine], None] | None = None,
        liveness: Liveness | None = None,
        min_step_interval: Callable[[int], float] | None = None,
    ) -> None:
        self._after_step = after_step
        # Seconds from a step's start before the next may start, asked after each step with the
        # requests the engine holds (shared/colocation/step_pacing.py); None: step whenever there is work.
        self._min_step_interval = min_step_interval
        self._next_step_at = 0.0
        self._calls: queue.SimpleQueue[tuple[Callable[[Engine], object], Future]] = queue.SimpleQueue()
        self._subscribers: dict[str, OutputCallback] = {}
        self._stopped = threading.Event()
        built: Future = Future()
        self._thread = threading.Thread(target=self._run, args=(make_engine, built), name="engine-loop", daemon=True)
        # The loop wakes at least every 0.5 s when idle; each call and step is a work item.
        self._watch = liveness.watch("engine loop", max_idle_s=10.0, thread=self._thread) if liveness is not None else None
        self._thread.start()
        self.engine: Engine = built.result()  # re-raises a failure to build

    def call(self, fn: Callable[[Engine], T]) -> Future:
        future: Future = Future()
        self._calls.put((fn, future))
        return future

    def subscribe(self, request_id: str, callback: OutputCallback) -> None:
        """``callback`` runs on the loop thread for each output of ``request_id``; it must not block."""
        self._subscribers[request_id] = callback

    def unsubscribe(self, request_id: str) -> None:
        self._subscribers.pop(request_id, None)

    def stop(self) -> None:
        self._stopped.set()
        self._calls.put((lambda engine: None, Future()))
        self._thread.join(timeout=10)

    def _run(self, make_engine: Callable[[], Engine], built: Future) -> None:
        try:
            self.engine = make_engine()
        except BaseException as exc:
            built.set_exception(exc)
            return
        built.set_result(self.engine)
        stalled = False
        while not self._stopped.is_set():
            if self._watch is not None:
                self._watch.tick()
            busy = self.engine.has_unfinished()
            wait_s = self._next_step_at - time.monotonic()
            try:
                # Idle: sleep until a call arrives. Stalled (the last step scheduled nothing: its
                # requests await embeddings an import brings): sleep until a call, briefly, rather
                # than spin. Busy: pick up calls already queued, or those arriving before the
                # next step is due.
                if not busy:
                    first = self._calls.get(timeout=0.5)
                elif stalled:
                    first = self._calls.get(timeout=STALLED_RETRY_S)
                else:
                    first = self._calls.get(timeout=wait_s) if wait_s > 0 else self._calls.get_nowait()
            except queue.Empty:
                first = None
            pending = [first] if first is not None else []
            while pending:
                fn, future = pending.pop()
                self._run_call(fn, future)
                try:
                    pending.append(self._calls.get_nowait())
                except queue.Empty:
                    pass
            stalled = False
            if self.engine.has_unfinished() and time.monotonic() >= self._next_step_at:
                num_steps = self.engine.num_steps
                self._step()
                stalled = self.engine.num_steps == num_steps

    def _step(self) -> None:
        started = time.monotonic()
        if self._watch is None:
            self._run_step()
        else:
            with self._watch.busy():
                self._run_step()
        if self._min_step_interval is not None:
            self._next_step_at = started + self._min_step_interval(len(self.engine.requests))

    def _run_step(self) -> None:
        try:
            outputs = self.engine.step()
        except BaseException as exc:
            for request_id in list(self.engine.requests):
                self.engine.abort(request_id)
                self._deliver(request_id, exc)
            return
        for output in outputs:
            self._deliver(output.request_id, output)
        for request_id, error in self.engine.take_failures():  # one request's own failure: only it hears
            self._deliver(request_id, error)
        if self._after_step is not None:
            try:
                self._after_step(self.engine)
            except Exception:
                log.exception("after-step hook failed")

    def _run_call(self, fn, future: Future) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn(self.engine))
        except BaseException as exc:
            future.set_exception(exc)

    def _deliver(self, request_id: str, item) -> None:
        callback = self._subscribers.get(request_id)
        if callback is None:
            return
        if isinstance(item, BaseException) or item.finished:
            self._subscribers.pop(request_id, None)
        try:
            callback(item)
        except Exception:
            log.exception("output callback for %s failed", request_id)
