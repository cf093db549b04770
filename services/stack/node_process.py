"""Starting one node process and waiting for it: free ports, a child that dies with its parent,
the gRPC health wait. The launcher (launcher.py) uses these for every role; so do tools and tests
that add a node to a running cluster by hand."""

from __future__ import annotations

import asyncio
import ctypes
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path
from typing import IO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def detach_but_die_with_parent() -> None:
    """Child setup: a session of its own, so a terminal's Ctrl-C reaches only the launcher (which
    stops roles in order), and SIGTERM if the launcher dies, so no role is ever orphaned."""
    os.setsid()
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


# Ports handed to servers that bind them later. They are drawn below Linux's ephemeral range
# (32768-60999 by default): a port from bind(0) lies inside it, and between our check and the
# server's bind any outgoing connection (gRPC, Redis, HTTP) may take it as its local port.
_PORT_RANGE = (20000, 32000)
_RANDOM = random.SystemRandom()  # independent of any seeding by the host program


def free_port(taken: Collection[int] = ()) -> int:
    """A loopback TCP port that is free now, outside the ephemeral range, and not in ``taken``
    (ports already handed out but not bound yet)."""
    for _ in range(200):
        port = _RANDOM.randint(*_PORT_RANGE)
        if port in taken:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {_PORT_RANGE[0]}-{_PORT_RANGE[1]}")


class ServerExitedError(RuntimeError):
    """A server process exited before it answered SERVING."""


def wait_serving(address: str, timeout_s: float, process: subprocess.Popen | None = None) -> None:
    """Wait until ``address`` answers SERVING; fail at once if ``process`` (its server) exits."""
    asyncio.run(_wait_serving(address, timeout_s, process))


async def _wait_serving(address: str, timeout_s: float, process: subprocess.Popen | None) -> None:
    deadline = time.monotonic() + timeout_s
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                raise ServerExitedError(f"the server for {address} exited with code {process.returncode} while starting")
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            await asyncio.sleep(0.2)
    raise TimeoutError(f"{address} did not become SERVING within {timeout_s}s")


def start_node(
    role: str,
    *,
    model: str,
    index_url: str,
    log: IO[str],
    host: str = "127.0.0.1",
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen, str]:
    """One more node of ``role`` joining a running cluster with nothing but the index URL, as an
    operator (or an autoscaler) adds one; returns the process and its gRPC address. Its ``env``
    (default: this process's) must carry the cluster's internal secret, if the cluster has one."""
    grpc_address = f"{host}:{free_port()}"
    argv = [sys.executable, "-m", "services.cli.main", "serve", "--role", role, "--model", model, "--index-url", index_url]
    argv += ["--grpc-address", grpc_address, *extra]
    if role != "preprocess":
        argv += ["--data-address", f"tcp://{host}:{free_port()}"]
    cwd = Path(__file__).resolve().parents[2]
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=detach_but_die_with_parent)
    return process, grpc_address
