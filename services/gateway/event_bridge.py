"""A blocking iterator (the pipeline's token events over synchronous gRPC) consumed from asyncio.

Each request's iterator runs on a thread of its own, so a thousand open streams block a thousand
cheap threads, never the event loop and never a fixed-size pool that would queue whole streams
behind each other. Items cross to the loop with ``call_soon_threadsafe``.

Cancellation: when the consumer stops early (the client went away, or the handler failed),
``on_stop`` runs at once (for a request: cancel its gRPC call in flight, which the thread may be
blocked in, such as a long prefill), and the thread is told to stop; it notices at its next item,
then closes the iterator, and closing the pipeline's iterator cancels its decode stream, which
frees the request's KV on the node.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

_END = object()


async def iterate_in_thread(
    make_iterator: Callable[[], Iterator[T]], *, name: str = "request", on_stop: Callable[[], None] = lambda: None
) -> AsyncIterator[T]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    stop = threading.Event()

    def deliver(item: object) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: the server is exiting, nobody is listening
            stop.set()

    def produce() -> None:
        iterator: Iterator[T] | None = None
        try:
            iterator = make_iterator()
            for item in iterator:
                if stop.is_set():
                    break
                deliver(item)
            deliver(_END)
        except BaseException as exc:  # handed to the consumer, raised there
            deliver(_Raised(exc))
        finally:
            if iterator is not None and hasattr(iterator, "close"):
                iterator.close()

    threading.Thread(target=produce, name=name, daemon=True).start()
    ended = False
    try:
        while True:
            item = await queue.get()
            if item is _END or isinstance(item, _Raised):
                ended = True
            if item is _END:
                return
            if isinstance(item, _Raised):
                raise item.exc
            yield item
    finally:
        stop.set()
        if not ended:
            on_stop()


class _Raised:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
