"""A servicer on a real in-process grpc.aio server, for tests that need real calls (deadlines,
cancellation, trailing metadata) without a node process."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import grpc


@asynccontextmanager
async def serving(add_servicer: Callable[[grpc.aio.Server], None]) -> AsyncIterator[grpc.aio.Channel]:
    """A channel to a loopback server that ``add_servicer`` filled; stopped on exit."""
    server = grpc.aio.server()
    add_servicer(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel
    finally:
        await server.stop(0)
