"""Shared gRPC plumbing: server construction (health, reflection, size limits, keepalive, the
internal plane's authentication), the server lifecycle (join the cluster once serving, drain on
SIGTERM/SIGINT), and channel options. How a node fails a call: services/transport/node_error.py."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.transport.internal_auth import InternalAuth, add_port, server_interceptors
from shared.liveness import Liveness
from shared.process_age import seconds_since_start
from shared.startup_heap import freeze_startup_heap

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
# Keepalive: a peer whose host vanished (no RST, no FIN) is detected by an unanswered HTTP/2 ping
# within KEEPALIVE_TIME + KEEPALIVE_TIMEOUT, not at the request's deadline; the call then fails
# UNAVAILABLE and the gateway's pipeline retries or migrates it.
KEEPALIVE_TIME_MS = 2000
KEEPALIVE_TIMEOUT_MS = 2000
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Reconnect quickly after a peer restarts, so service resumes without operator action.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.http2.max_pings_without_data", 0),
]
# Servers accept pings as often as clients send them (the default answers frequent pings with
# GOAWAY "too_many_pings", which would tear down healthy channels).
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
    ("grpc.http2.max_ping_strikes", 0),
]

log = logging.getLogger("tessera")


@dataclass(slots=True)
class Lifecycle:
    """How a role's server joins and leaves the cluster.

    Start: bind -> SERVING -> ``on_start`` (register in the index: only a node that answers is
    ever routed to; should it raise, the server stops, ``on_stop`` runs and the error
    propagates). SIGTERM, a drain: NOT_SERVING -> ``on_drain`` (deregister, so no router picks it
    again) -> refuse new calls and give the ones in flight up to ``drain_timeout_s`` to finish ->
    ``on_stop`` (release resources) -> exit. A call refused while draining fails
    UNAVAILABLE, which the gateway retries on another node.
    """

    drain_timeout_s: float = 30.0
    on_start: Callable[[], None] | None = None
    on_drain: Callable[[], None] | None = None
    on_stop: Callable[[], None] | None = None
    liveness: Liveness | None = None


async def serve_forever(server: grpc.aio.Server, address: str, service_names: list[str], lifecycle: Lifecycle, auth: InternalAuth) -> None:
    """Bind (with mTLS when ``auth`` has it), mark every service SERVING, and run until
    SIGTERM/SIGINT, then drain."""
    health_servicer = health.aio.HealthServicer() if hasattr(health, "aio") else health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    port = add_port(server, address, auth)
    if port == 0:
        raise RuntimeError(f"could not bind gRPC address {address}")
    await server.start()
    for name in ["", *service_names]:
        await _set_status(health_servicer, name, health_pb2.HealthCheckResponse.SERVING)
    stop = asyncio.Event()
    ticker = asyncio.create_task(report_liveness(health_servicer, ["", *service_names], lifecycle.liveness, stop))
    if lifecycle.on_start is not None:
        try:
            lifecycle.on_start()
        except BaseException:  # e.g. the cluster refused this node: stop serving, release, and fail
            await server.stop(0)
            ticker.cancel()
            if lifecycle.on_stop is not None:
                lifecycle.on_stop()
            raise
    age = seconds_since_start()
    after = f", {age:.2f} s after its process started" if age is not None else ""
    log.info("serving %s on %s (%d start-up objects frozen%s)", ", ".join(service_names), address, freeze_startup_heap(), after)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("draining (up to %.0fs for calls in flight)", lifecycle.drain_timeout_s)
    for name in ["", *service_names]:
        await _set_status(health_servicer, name, health_pb2.HealthCheckResponse.NOT_SERVING)
    if lifecycle.on_drain is not None:
        await asyncio.to_thread(lifecycle.on_drain)
    await server.stop(lifecycle.drain_timeout_s)
    ticker.cancel()
    if lifecycle.on_stop is not None:
        lifecycle.on_stop()
    log.info("drained; exiting")


async def report_liveness(
    servicer, names: list[str], liveness: Liveness | None, draining: asyncio.Event | None = None, period_s: float = 1.0
) -> None:
    """Ticks the event loop's watch (proof that it, which runs every servicer, is not blocked),
    and turns the gRPC health of ``names`` NOT_SERVING while the node's liveness has a problem
    (a hung engine step, a dead compute thread: the signal its heartbeat stops on), SERVING
    again once it clears. A kubelet's gRPC liveness probe then restarts a hung node. Once
    ``draining`` is set the drain owns the status (NOT_SERVING for good); the ticks go on."""
    if liveness is None:
        return
    watch = liveness.watch("event loop", max_idle_s=10.0)
    serving = True
    while True:
        watch.tick()
        problems = liveness.problems()
        if bool(problems) == serving and not (draining is not None and draining.is_set()):
            serving = not problems
            if problems:
                log.error("not serving: %s", "; ".join(problems))
            status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
            for name in names:
                await _set_status(servicer, name, status)
        await asyncio.sleep(period_s)


async def _set_status(servicer, name: str, status) -> None:
    result = servicer.set(name, status)
    if asyncio.iscoroutine(result):
        await result


def new_server(auth: InternalAuth) -> grpc.aio.Server:
    """A node's server; with a secret in ``auth``, calls without the cluster's token are refused."""
    from services.transport.tracing_interceptor import TracingServerInterceptor

    return grpc.aio.server(options=SERVER_OPTIONS, interceptors=[*server_interceptors(auth), TracingServerInterceptor()])
