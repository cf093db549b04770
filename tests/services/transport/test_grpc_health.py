"""A node's gRPC health follows its liveness: a blocked engine step turns it NOT_SERVING (so a
kubelet's gRPC probe restarts the node), and it serves again once the step ends. A real grpc.aio
server and health client, in one process."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.stack.node_process import free_port
from services.transport.grpc_server import report_liveness
from shared.liveness import Liveness

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


async def wait_for_status(stub, want, timeout_s: float = 5.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
        if reply.status == want:
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    raise AssertionError(f"health did not become {want} within {timeout_s}s")


def test_a_blocked_engine_step_turns_health_not_serving_until_it_ends():
    async def scenario() -> None:
        server = grpc.aio.server()
        servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        port = free_port()
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await servicer.set("", SERVING)
        liveness = Liveness(stall_s=0.3)
        engine = liveness.watch("engine loop")
        reporter = asyncio.create_task(report_liveness(servicer, [""], liveness, period_s=0.1))
        release = threading.Event()

        def blocked_step() -> None:
            with engine.busy():
                release.wait(10)

        step = threading.Thread(target=blocked_step)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                await wait_for_status(stub, SERVING)
                step.start()
                assert await wait_for_status(stub, NOT_SERVING) < 0.3 + 1.0  # the stall limit, plus a period or so
                release.set()
                await wait_for_status(stub, SERVING)
        finally:
            release.set()
            if step.is_alive():
                step.join(5)
            reporter.cancel()
            await server.stop(0)

    asyncio.run(scenario())
