"""The last guard of the HTTP API: an exception that no handler mapped to a status becomes a 500
in OpenAI's error shape, logged once with its traceback, and the client's connection stays usable.

Why a middleware of our own: Starlette's ServerErrorMiddleware also answers 500, but then re-raises,
and uvicorn closes a connection whose application raised, so the client's next request on that
keep-alive connection is reset. This middleware sits inside it and does not re-raise what it
answered. A response already under way cannot change its status: its body is ended where it is
(a stream reports the error as its last event itself, responses.py). Client errors never reach
here: they are GatewayErrors, mapped by the app's handlers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from services.gateway.errors import GatewayError

logger = logging.getLogger(__name__)


def unexpected_error(exc: BaseException, what: str) -> GatewayError:
    """The 500 a client gets for a fault of the gateway's own (logged here, with ``what`` it was
    doing); the message names no internals."""
    logger.error("unexpected error %s", what, exc_info=exc)
    return GatewayError(500, f"internal error while {what} ({type(exc).__name__}); the request was not completed")


class UnexpectedErrorMiddleware:
    def __init__(self, app, *, on_error: Callable[[dict], None] = lambda _scope: None) -> None:
        self.app = app
        self.on_error = on_error  # told of each 500 answered here, with the request's scope

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = ended = False

        async def tracking_send(message) -> None:
            nonlocal started, ended
            started = started or message["type"] == "http.response.start"
            ended = ended or (message["type"] == "http.response.body" and not message.get("more_body", False))
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:  # the point of this guard; BaseException (a cancellation) passes
            error = unexpected_error(exc, f"serving {scope.get('method', '')} {scope.get('path', '')}")
            if not started:
                self.on_error(scope)
                body = json.dumps(error.to_json()).encode()
                headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
                await send({"type": "http.response.start", "status": 500, "headers": headers})
                await send({"type": "http.response.body", "body": body})
            elif not ended:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
