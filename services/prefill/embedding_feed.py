"""Feeding a request's embeddings to the prefill engine window by window while it runs.

A request's images and video groups need not be resident all at once: the engine computes a
prompt up to the first item whose embeddings are not imported yet, and frees each item's rows
once it has computed past it (scheduler.py). So the node brings the first window
(embedding_window.py) before the request starts (for a request that fits the cache, nearly all,
that is every item, as it always was), then the next windows as the engine frees room: a clip of
any length runs through a cache that holds one of its groups.

An import that finds the cache full (another request took the room since the plan) starts the
request if it has not started, then waits for the engine's next step: a started request holds
only items it can compute through, so the room comes. While the request runs with every item it
needs referenced, the feed only watches: if the engine lost one it still needs (the request was
preempted and the item evicted, or an image recurs after its first occurrence released it), the
scheduler marks the request awaiting it, and the feed brings it again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import torch

from services.engine.remote_request import PromptItem
from services.engine.request import Request
from services.prefill.embedding_window import Window
from services.prefill.embeddings import ResidentEmbeddings
from services.prefill.job import PrefillJob, Upstream
from shared.types import MmHash

# A waiter for the engine's next step looks again after this long at most: a step notified
# before it registered, or room freed by an abort rather than a step, costs no more.
STEP_WAIT_S = 0.05


class StepSignal:
    """Wakes the coroutines waiting for the engine's next step. ``notify`` runs on the engine
    thread (the node's after-step hook); the waiters live on the serving event loop."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: list[asyncio.Future[None]] = []

    async def next_step(self, timeout_s: float = STEP_WAIT_S) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, timeout_s)
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    def notify(self) -> None:
        loop = self._loop
        if loop is not None and self._waiters:
            with contextlib.suppress(RuntimeError):  # that loop has closed: nobody waits on it
                loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


class RequestEndedError(Exception):
    """The request left the engine (answered, failed or aborted) while its embeddings were
    still being brought: the feed stops, and the engine's outcome is the request's."""


class EmbeddingFeed:
    def __init__(
        self,
        embeddings: ResidentEmbeddings,
        job: PrefillJob,
        request: Request,
        upstream: Upstream,
        steps: StepSignal,
        start: Callable[[], Awaitable[None]],
        ended: Callable[[], bool],
    ) -> None:
        self.embeddings = embeddings
        self.job = job
        self.request = request  # the engine's, built before it starts
        self.upstream = upstream
        self.steps = steps
        self.start = start  # starts the request in the engine (idempotent)
        self.ended = ended  # whether the engine has answered the started request, or failed it
        self._pixels: dict[MmHash, torch.Tensor] = {}  # local-encode pixels taken so far, held for later windows

    async def first_window(self) -> None:
        """Bring what fits before the request starts: every item, for a request that fits."""
        await self._bring(await self._plan())

    async def alongside(self, done: asyncio.Future) -> None:
        """Bring the rest while the started request runs, until it is answered (``done``). The
        caller bounds the whole with the prefill's timeout."""
        while not done.done():
            window = await self._plan()
            if window.lacking:
                self.embeddings.metrics.num_windows_while_running.inc()
                await self._bring(window)
            elif window.complete:
                await self._until_awaiting(done)
            else:  # the next item does not fit yet: the engine frees rows as it computes
                await self._next_step_or(done)

    async def _plan(self) -> Window:
        return await asyncio.wrap_future(self.embeddings.plan(self.request, self.job.items))

    async def _bring(self, window: Window) -> None:
        if window.lacking:
            await self.embeddings.bring(self.job, window.lacking, self.upstream, self._on_full, self._local_pixels, self.request.lora)

    async def _local_pixels(self, items: list[PromptItem]) -> dict[MmHash, torch.Tensor]:
        self._pixels.update(await self.embeddings.take_local_pixels(self.job, items, self._pixels.keys()))
        return self._pixels

    async def _on_full(self) -> None:
        """An import found the cache full: start the request (it frees rows as it computes) and
        wait a step; stop if the engine has answered or failed it meanwhile."""
        await self.start()
        if self.ended():
            raise RequestEndedError
        await self.steps.next_step()
        if self.ended():
            raise RequestEndedError

    async def _until_awaiting(self, done: asyncio.Future) -> None:
        """Watch, step by step, until the request is answered or the engine awaits an item."""
        while not done.done():
            await self._next_step_or(done)
            if self.request.awaiting_import is not None:
                return

    async def _next_step_or(self, done: asyncio.Future) -> None:
        step = asyncio.ensure_future(self.steps.next_step())
        await asyncio.wait({step, done}, return_when=asyncio.FIRST_COMPLETED)
        if not step.done():
            step.cancel()
