"""The last guard (services/gateway/http/unexpected_errors.py), on a real uvicorn server: a fault inside
a handler is a 500 with OpenAI's error body, and the client's keep-alive connection serves its next
request; a fault in a stream ends it with an error event."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from services.stack.node_process import free_port
from tests.services.gateway.http.test_app import MESSAGES, FakePipeline, gateway_for


class FaultyPipeline(FakePipeline):
    """Raises a plain bug (not a GatewayError) for requests whose max_tokens is 13."""

    async def run(self, body, sampling, **kwargs):
        if sampling.max_tokens == 13:
            raise RuntimeError("a bug, not the client's fault")
        async for event in super().run(body, sampling, **kwargs):
            yield event


@contextmanager
def served(pipeline: FakePipeline) -> Iterator[int]:
    app, _ = gateway_for(pipeline)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical", loop="asyncio", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def post(connection: http.client.HTTPConnection, body: dict) -> tuple[int, str, http.client.HTTPResponse]:
    connection.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    response = connection.getresponse()
    return response.status, response.read().decode(), response


def test_a_fault_in_a_handler_is_a_500_with_an_error_body_and_the_connection_serves_the_next_request():
    with served(FaultyPipeline()) as port:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        status, text, response = post(connection, {"model": "tiny", "messages": MESSAGES, "max_tokens": 13})
        assert status == 500 and not response.will_close
        error = json.loads(text)["error"]
        assert error["type"] == "internal_error" and "RuntimeError" in error["message"] and "not the client" not in error["message"]
        socket = connection.sock
        status, text, _ = post(connection, {"model": "tiny", "messages": MESSAGES, "max_tokens": 3})
        assert status == 200 and json.loads(text)["choices"][0]["message"]["content"] == "Hello there friend"
        assert connection.sock is socket  # the same connection, not a silent reconnect
        connection.close()


def test_a_fault_in_a_stream_ends_it_with_an_error_event_on_a_usable_connection():
    with served(FakePipeline(error=RuntimeError("a bug mid-stream"), fail_after=1)) as port:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        status, text, response = post(connection, {"model": "tiny", "messages": MESSAGES, "max_tokens": 3, "stream": True})
        events = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
        assert status == 200 and not response.will_close
        assert json.loads(events[-1])["error"]["type"] == "internal_error" and "[DONE]" not in events
        socket = connection.sock
        assert post(connection, {"model": "tiny", "messages": MESSAGES, "max_tokens": 3})[0] == 500  # the same fault, unstreamed
        assert connection.sock is socket
        connection.close()
