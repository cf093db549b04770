"""An ASGI middleware that bounds request bodies: a declared Content-Length over the limit is
refused before a byte is read, and a chunked body is cut off once it passes the limit, so no
client can make the gateway buffer more than ``max_body_bytes`` for one request."""

from __future__ import annotations

import json
from collections.abc import Callable

from services.gateway.errors import GatewayError


class BodyLimitMiddleware:
    def __init__(self, app, *, max_body_bytes: int, on_reject: Callable[[], None] = lambda: None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.on_reject = on_reject

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await self._reject(send, f"request body is {declared} bytes; the limit is {self.max_body_bytes}")
            return
        num_received = 0
        started = False

        async def counting_receive():
            nonlocal num_received
            message = await receive()
            if message["type"] == "http.request":
                num_received += len(message.get("body", b""))
                if num_received > self.max_body_bytes:
                    raise _TooLarge
            return message

        async def tracking_send(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._reject(send, f"request body is over the limit of {self.max_body_bytes} bytes")

    async def _reject(self, send, message: str) -> None:
        self.on_reject()
        body = json.dumps(GatewayError(413, message).to_json()).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(BaseException):  # not Exception: FastAPI turns those from body parsing into a 400
    pass


def _content_length(scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
