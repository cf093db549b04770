"""Cross-request batching of Encode calls, under a row budget.

Calls line up here in arrival order. One worker at a time takes the head of the line: every call
still waited for, in order, while their embedding rows fit ``max_batch_rows`` (the first call is
always taken, whatever its size), and hands them to the node as one batch, one vision-tower pass
over all their new images. Calls that went away while they waited (cancelled, or past their
deadline) leave the line and are never encoded for nobody. While a batch runs, new calls line up
for the next one, so under load the batches grow by themselves and the tower's matrix products
get more rows; an idle node encodes a lone call at once, with no waiting for company.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.node_metrics import Counter, Histogram, counter, histogram

if TYPE_CHECKING:  # the node imports torch; the role's settings import this module before torch
    from services.encoder.node import EncodeItem, EncodeResult

DEFAULT_MAX_BATCH_ROWS = 16384
# On CPU, one call per pass: the tower is compute-bound at any image worth encoding (a 448x448
# image is 1024 patches, rows enough for full-speed matrix products), so a batch of two only holds
# the first image's embeddings back until the second's are done: a worse TTFT tail for the same
# throughput (docs/benchmarks.md, "One Encode call per tower pass on CPU"). An accelerator
# amortizes its launches over a batch.
CPU_MAX_BATCH_ROWS = 1


def default_max_batch_rows(device: str) -> int:
    return CPU_MAX_BATCH_ROWS if device == "cpu" else DEFAULT_MAX_BATCH_ROWS


RunBatch = Callable[[list[tuple[list["EncodeItem"], str]]], Awaitable[list["EncodeResult | Exception"]]]


class DeadlinePassedError(Exception):
    pass


@dataclass(slots=True)
class BatchMetrics:
    num_batches: Counter = counter("encoder_batches_total", "Batches of Encode calls handed to the node")
    num_calls_batched: Counter = counter("encoder_calls_batched_total", "Encode calls handed to the node in a batch")
    queue_time: Histogram = histogram("queue_seconds", "An Encode call's wait for its batch to start")


@dataclass(slots=True)
class QueuedCall:
    items: list[EncodeItem]
    target: str
    future: asyncio.Future
    queued_at: float
    deadline: float | None  # time.monotonic() after which nobody waits for it

    @property
    def num_rows(self) -> int:
        return sum(item.num_embeds for item in self.items)


class EncodeBatcher:
    def __init__(self, run_batch: RunBatch, *, max_batch_rows: int = DEFAULT_MAX_BATCH_ROWS, metrics: BatchMetrics | None = None):
        if max_batch_rows < 1:
            raise ValueError("max_batch_rows must be at least 1")
        self.run_batch = run_batch
        self.max_batch_rows = max_batch_rows
        self.metrics = metrics if metrics is not None else BatchMetrics()  # the node's, to be exported with its own
        self._line: deque[QueuedCall] = deque()
        self._worker: asyncio.Task | None = None

    async def encode(self, items: list[EncodeItem], target: str, *, timeout_s: float | None = None) -> EncodeResult:
        """The call's result once its batch ran. Raises the call's own failure, or
        DeadlinePassedError when it waited past ``timeout_s``."""
        now = time.monotonic()
        call = QueuedCall(items, target, asyncio.get_running_loop().create_future(), now, None if timeout_s is None else now + timeout_s)
        self._line.append(call)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._work())
        return await call.future  # cancelling the caller cancels the future: the worker skips it

    def take_batch(self, now: float) -> list[QueuedCall]:
        batch: list[QueuedCall] = []
        num_rows = 0
        while self._line:
            call = self._line[0]
            if call.future.done():  # its caller went away
                self._line.popleft()
                continue
            if call.deadline is not None and call.deadline <= now:
                self._line.popleft()
                call.future.set_exception(DeadlinePassedError("the call's deadline passed while it waited for a batch"))
                continue
            if batch and num_rows + call.num_rows > self.max_batch_rows:
                break
            self._line.popleft()
            batch.append(call)
            num_rows += call.num_rows
        return batch

    async def _work(self) -> None:
        while batch := self.take_batch(time.monotonic()):
            started = time.monotonic()
            for call in batch:
                self.metrics.queue_time.observe(started - call.queued_at)
            self.metrics.num_batches.inc()
            self.metrics.num_calls_batched.inc(len(batch))
            try:
                results = await self.run_batch([(call.items, call.target) for call in batch])
            except Exception as exc:  # the node itself failed: every call of the batch gets it
                results = [exc] * len(batch)
            for call, result in zip(batch, results):
                if call.future.done():
                    continue
                if isinstance(result, Exception):
                    call.future.set_exception(result)
                else:
                    call.future.set_result(result)
