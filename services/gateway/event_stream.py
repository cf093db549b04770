"""The HTTP response that carries a stream of server-sent events, stopped when the client goes.

Why not Starlette's StreamingResponse: below ASGI spec 2.4 (uvicorn's httptools protocol declares
2.3) it runs every stream in an anyio task group, and a task group's cancellation is delivered
again on every event-loop cycle until its tasks have ended: a cost per stream that shows at a
thousand streams (docs/benchmarks.md, "The gateway's per-request costs").

Here the events are written by one plain asyncio task while a second waits for the client's
``http.disconnect``. Whichever ends first decides: the stream ran out (the watcher is cancelled),
or the client left (the writer is cancelled at its current await, which closes the event
iterator and with it the request's work on every node). The same holds as in Starlette: nothing
is written after a disconnect, and the response returns only once the writer has finished.
"""

from __future__ import annotations

import asyncio

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


class EventStreamResponse(StreamingResponse):
    media_type = "text/event-stream"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        loop = asyncio.get_running_loop()
        writer = loop.create_task(self.stream_response(send))
        watcher = loop.create_task(_until_disconnect(receive))
        try:
            await asyncio.wait((writer, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            # The server shutting down cancels this task: both children go with it.
            watcher.cancel()
            writer.cancel()  # a no-op once the stream has run out
            await asyncio.wait((writer, watcher))
        error = None if writer.cancelled() else writer.exception()
        if error is None and not watcher.cancelled():
            error = watcher.exception()  # the server's receive failed: the stream was cut short
        if error is not None:
            raise error
        if self.background is not None:
            await self.background()


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
