"""A request's async token events, produced by a task of its own and consumed from any task.

Why a task: the events are read from more than one task (a stream's first event by the HTTP
handler, the rest by the response's writer, or by one pump per choice), while the pipeline keeps
its trace span current across its awaits; a span (a context variable) can only be entered and
left within one task. So the pipeline runs in its own task, and events cross over a bounded
queue, which also passes a slow client's backpressure back to the decode stream.

Cancellation: when the consumer stops early (the client went away, or the handler failed), the
producing task is cancelled. That cancels the gRPC call it is awaiting (a long prefill, a decode
stream), which cancels the work on the node too, and nothing is retried.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

MAX_BUFFERED = 64  # events a slow consumer may fall behind before the producer waits


@dataclass(frozen=True, slots=True)
class _Ended:
    error: BaseException | None = None


async def events_in_task(make_events: Callable[[], AsyncIterator[T]], *, name: str = "request") -> AsyncIterator[T]:
    queue: asyncio.Queue = asyncio.Queue(MAX_BUFFERED)

    async def produce() -> None:
        try:
            async for item in make_events():
                await queue.put(item)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the consumer, raised there
            await queue.put(_Ended(exc))
            return
        await queue.put(_Ended())

    task = asyncio.get_running_loop().create_task(produce(), name=name)
    try:
        while not isinstance(item := await queue.get(), _Ended):
            yield item
        if item.error is not None:
            raise item.error
    finally:
        task.cancel()  # no-op once it has ended
        task.add_done_callback(_retrieve)


def _retrieve(task: asyncio.Task) -> None:
    """A cancelled producer's own cleanup error has nobody to go to: retrieve it so asyncio does not log it as lost."""
    if not task.cancelled():
        task.exception()
