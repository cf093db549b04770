"""The event-stream response writes every event, stops at a disconnect, and leaves no task behind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from services.gateway.http.responses import EventStreamResponse


class _Client:
    """An ASGI server's side of one response: what was sent, and a disconnect the test triggers."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.gone = asyncio.Event()
        self.num_receives_cancelled = 0

    async def receive(self) -> dict:
        try:
            await self.gone.wait()
        except asyncio.CancelledError:
            self.num_receives_cancelled += 1
            raise
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        assert not self.gone.is_set(), "nothing is written after the client left"
        self.sent.append(message)

    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self.sent if m["type"] == "http.response.body"]


async def _one_event_then_waiting(closed: list[bool]) -> AsyncIterator[bytes]:
    """A decode stream with no next token yet; ``closed`` records that it was closed, which is
    where the request's work is cancelled on every node."""
    try:
        yield b"data: 0\n\n"
        await asyncio.Event().wait()
    finally:
        closed.append(True)


def _call(response: EventStreamResponse, client: _Client):
    return response({"type": "http", "asgi": {"spec_version": "2.3"}}, client.receive, client.send)


def test_every_event_is_written_then_the_body_ends_and_the_watcher_is_cancelled():
    async def events() -> AsyncIterator[bytes]:
        for i in range(3):
            yield f"data: {i}\n\n".encode()

    async def scenario() -> _Client:
        client = _Client()
        await _call(EventStreamResponse(events()), client)
        assert asyncio.all_tasks() == {asyncio.current_task()}
        return client

    client = asyncio.run(scenario())
    assert client.sent[0]["type"] == "http.response.start" and client.sent[0]["status"] == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in client.sent[0]["headers"]
    assert client.bodies() == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n", b""]
    assert client.sent[-1]["more_body"] is False
    assert client.num_receives_cancelled == 1


def test_a_disconnect_closes_the_event_iterator_where_it_waits_and_writes_nothing_more():
    closed = []

    async def scenario() -> _Client:
        client = _Client()
        call = asyncio.get_running_loop().create_task(_call(EventStreamResponse(_one_event_then_waiting(closed)), client))
        while not client.bodies():
            await asyncio.sleep(0)
        client.gone.set()
        await asyncio.wait_for(call, timeout=5)  # returns, without an error
        assert asyncio.all_tasks() == {asyncio.current_task()}
        return client

    client = asyncio.run(scenario())
    assert client.bodies() == [b"data: 0\n\n"] and closed == [True]


def test_an_error_in_the_events_reaches_the_server():
    async def events() -> AsyncIterator[bytes]:
        yield b"data: 0\n\n"
        raise RuntimeError("broken stream")

    async def scenario() -> None:
        await _call(EventStreamResponse(events()), _Client())

    with pytest.raises(RuntimeError, match="broken stream"):
        asyncio.run(scenario())


def test_a_failing_receive_ends_the_stream_and_reaches_the_server():
    closed: list[bool] = []

    async def broken_receive() -> dict:
        await asyncio.sleep(0.01)
        raise RuntimeError("receive failed")

    async def scenario() -> None:
        client = _Client()
        await EventStreamResponse(_one_event_then_waiting(closed))({"type": "http"}, broken_receive, client.send)

    with pytest.raises(RuntimeError, match="receive failed"):
        asyncio.run(scenario())
    assert closed == [True]


def test_a_cancelled_response_cancels_its_writer_and_watcher():
    closed = []

    async def scenario() -> None:
        client = _Client()
        call = asyncio.get_running_loop().create_task(_call(EventStreamResponse(_one_event_then_waiting(closed)), client))
        while not client.bodies():
            await asyncio.sleep(0)
        call.cancel()  # the server shutting down
        with pytest.raises(asyncio.CancelledError):
            await call
        assert asyncio.all_tasks() == {asyncio.current_task()} and client.num_receives_cancelled == 1

    asyncio.run(scenario())
    assert closed == [True]
