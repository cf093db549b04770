"""Shared gRPC plumbing: server construction (health, reflection, size limits), graceful
shutdown on SIGTERM/SIGINT, channel options, and the mapping of errors to status codes."""

from __future__ import annotations

import asyncio
import logging
import signal

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Reconnect quickly after a peer restarts, so service resumes without operator action.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
# The HTTP status a gRPC error maps to, carried in trailing metadata by thin servicers.
HTTP_STATUS_KEY = "tessera-http-status"

log = logging.getLogger("tessera")


async def serve_forever(server: grpc.aio.Server, address: str, service_names: list[str], *, grace_s: float = 5.0, on_stop=None) -> None:
    """Bind, mark every service SERVING, and run until SIGTERM/SIGINT, then drain gracefully."""
    health_servicer = health.aio.HealthServicer() if hasattr(health, "aio") else health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise RuntimeError(f"could not bind gRPC address {address}")
    await server.start()
    for name in ["", *service_names]:
        await _set_status(health_servicer, name, health_pb2.HealthCheckResponse.SERVING)
    log.info("serving %s on %s", ", ".join(service_names), address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for name in ["", *service_names]:
        await _set_status(health_servicer, name, health_pb2.HealthCheckResponse.NOT_SERVING)
    await server.stop(grace_s)
    if on_stop is not None:
        on_stop()


async def _set_status(servicer, name: str, status) -> None:
    result = servicer.set(name, status)
    if asyncio.iscoroutine(result):
        await result


def new_server() -> grpc.aio.Server:
    from services.transport.tracing_interceptor import TracingServerInterceptor

    return grpc.aio.server(options=CHANNEL_OPTIONS, interceptors=[TracingServerInterceptor()])


async def abort_with(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str, http_status: int) -> None:
    context.set_trailing_metadata(((HTTP_STATUS_KEY, str(http_status)),))
    await context.abort(code, message)
