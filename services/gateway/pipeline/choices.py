"""A request's choices as one stream of (generation, token event), in arrival order.

Order of work: the first choice runs alone until its first token, which means its prompt has
been prefilled and its KV blocks are in the prefill node's prefix cache; only then do the other
choices start, so their prompts are cache hits instead of n concurrent prefills of the same
tokens. Errors before that first token therefore surface before anything is sent to the client.
Any choice failing fails the request; the others are cancelled.

Each choice's events come from a task of its own (``events_in_task``): the events are read from
more than one task (a stream's first event by the HTTP handler, the rest by the response's
writer, or by one pump per choice), while the pipeline keeps its trace span current across its
awaits, and a span (a context variable) can only be entered and left within one task. Events
cross over a bounded queue, which also passes a slow client's backpressure back to the decode
stream. When the consumer stops early (the client went away, or the handler failed), the
producing task is cancelled: that cancels the gRPC call it awaits (a long prefill, a decode
stream), which cancels the work on the node too, and nothing is retried.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TypeVar

import anyio

from services.gateway.frontend.openai_api import Generation
from services.gateway.pipeline.token_events import TokenEvent

OpenEvents = Callable[[Generation], AsyncIterator[TokenEvent]]


async def merged_events(open_events: OpenEvents, generations: tuple[Generation, ...]) -> AsyncIterator[tuple[Generation, TokenEvent]]:
    first_generation, rest = generations[0], generations[1:]
    first_events = open_events(first_generation)
    if not rest:
        try:
            async for event in first_events:
                yield first_generation, event
        finally:
            await first_events.aclose()
        return
    iterators = [first_events]
    tasks: list[asyncio.Task] = []
    try:
        yield first_generation, await anext(first_events)
        iterators += [open_events(g) for g in rest]
        queue: asyncio.Queue = asyncio.Queue()
        tasks = [asyncio.create_task(_pump(g, it, queue)) for g, it in zip(generations, iterators)]
        for _ in range(len(tasks)):  # one end marker per choice
            while (item := await queue.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
    finally:
        for task in tasks:
            task.cancel()
        with anyio.CancelScope(shield=True):  # a disconnect cancels us; the cleanup must still run
            await asyncio.gather(*tasks, return_exceptions=True)
            for iterator in iterators:
                await iterator.aclose()


async def _pump(generation: Generation, events: AsyncIterator[TokenEvent], queue: asyncio.Queue) -> None:
    try:
        async for event in events:
            queue.put_nowait((generation, event))
    except Exception as exc:
        queue.put_nowait(exc)
    queue.put_nowait(None)


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
