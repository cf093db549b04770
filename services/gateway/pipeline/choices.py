"""A request's choices as one stream of (generation, token event), in arrival order.

Order of work: the first choice runs alone until its first token, which means its prompt has
been prefilled and its KV blocks are in the prefill node's prefix cache; only then do the other
choices start, so their prompts are cache hits instead of n concurrent prefills of the same
tokens. Errors before that first token therefore surface before anything is sent to the client.
Any choice failing fails the request; the others are cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

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
