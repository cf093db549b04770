"""A blocking iterator consumed from asyncio: items arrive in order, errors reach the consumer,
and a consumer that stops early runs ``on_stop`` at once (which cancels a request's gRPC call in
flight) and closes the iterator."""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.gateway.event_bridge import iterate_in_thread


class Source:
    def __init__(self, num_items: int, *, fail_at: int | None = None) -> None:
        self.num_items, self.fail_at = num_items, fail_at
        self.closed = threading.Event()
        self.release = threading.Semaphore(0)  # one item per release once gated
        self.gated = False

    def __call__(self):
        try:
            for i in range(self.num_items):
                if self.gated:
                    self.release.acquire(timeout=10)
                if i == self.fail_at:
                    raise ValueError(f"item {i} is bad")
                yield i
        finally:
            self.closed.set()


def collect(source: Source) -> list[int]:
    async def run():
        return [item async for item in iterate_in_thread(source)]

    return asyncio.run(run())


def test_items_arrive_in_order_and_the_iterator_is_closed():
    source = Source(50)
    assert collect(source) == list(range(50)) and source.closed.is_set()


def test_on_stop_is_not_run_when_the_iterator_ends_by_itself():
    stopped = threading.Event()

    async def run():
        return [item async for item in iterate_in_thread(Source(3), on_stop=stopped.set)]

    assert asyncio.run(run()) == [0, 1, 2] and not stopped.is_set()


def test_an_error_on_the_thread_is_raised_to_the_consumer():
    source = Source(5, fail_at=3)
    with pytest.raises(ValueError, match="item 3 is bad"):
        collect(source)
    assert source.closed.is_set()


def test_a_consumer_that_stops_early_closes_the_blocking_iterator():
    source = Source(1000)
    source.gated = True

    stopped = threading.Event()

    async def take_two_and_leave():
        events = iterate_in_thread(source, on_stop=stopped.set)
        source.release.release()
        source.release.release()
        got = [await anext(events), await anext(events)]
        await events.aclose()  # what a client disconnect does
        assert stopped.is_set()  # at once, while the thread is still blocked
        source.release.release()  # the thread notices at its next item
        return got

    assert asyncio.run(take_two_and_leave()) == [0, 1]
    assert source.closed.wait(5), "the producing iterator was never closed"
