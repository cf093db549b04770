"""``tessera health ADDRESS`` and ``tessera drain --pid PID``: the probes and hooks containers use
(compose healthchecks, Kubernetes preStop)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time

COMMANDS = ("health", "drain")


def register(subparsers: argparse._SubParsersAction) -> None:
    health = subparsers.add_parser("health", help="exit 0 if the gRPC server at ADDRESS answers SERVING")
    health.add_argument("address", help="host:port of a role's gRPC server")
    health.add_argument("--timeout-s", type=float, default=3.0)
    tls = health.add_argument_group("mTLS (as the node's own --internal-tls-* flags; each also TESSERA_SERVE_INTERNAL_TLS_<NAME>)")
    for name in ("cert", "key", "ca", "server-name"):
        env = f"TESSERA_SERVE_INTERNAL_TLS_{name.upper().replace('-', '_')}"
        tls.add_argument(f"--internal-tls-{name}", default=os.environ.get(env) or None)
    health.set_defaults(func=run_health)
    drain = subparsers.add_parser("drain", help="SIGTERM a server (it deregisters and finishes its work) and wait for it to exit")
    drain.add_argument("--pid", type=int, default=1, help="the server's process id (1 in a container)")
    drain.add_argument("--timeout-s", type=float, default=30.0)
    drain.set_defaults(func=run_drain)


def run_health(args: argparse.Namespace) -> int:
    """Health checks need no cluster token (they stay open); with mTLS they need the certificate."""
    from pathlib import Path

    import grpc
    from grpc_health.v1 import health_pb2

    from services.transport.internal_auth import InternalAuth, InternalPlaneSettings

    def path(value: str | None) -> Path | None:
        return Path(value) if value else None

    try:
        settings = InternalPlaneSettings(
            internal_tls_cert=path(args.internal_tls_cert),
            internal_tls_key=path(args.internal_tls_key),
            internal_tls_ca=path(args.internal_tls_ca),
            internal_tls_server_name=args.internal_tls_server_name,
        )
        auth = InternalAuth.from_settings(settings, env={})
    except (ValueError, OSError) as exc:
        print(f"tessera health: {exc}", file=sys.stderr)
        return 2
    try:
        reply = asyncio.run(_check(args.address, auth, args.timeout_s))
    except grpc.RpcError as exc:
        print(f"{args.address}: {exc.code().name}", file=sys.stderr)
        return 1
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    print(f"{args.address}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}")
    return 0 if serving else 1


async def _check(address: str, auth, timeout_s: float):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from services.transport.internal_channel import internal_channel

    async with internal_channel(address, auth) as channel:
        return await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)


def run_drain(args: argparse.Namespace) -> int:
    try:
        os.kill(args.pid, signal.SIGTERM)
    except ProcessLookupError:
        return 0
    deadline = time.monotonic() + args.timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(args.pid, 0)
        except ProcessLookupError:
            return 0
        time.sleep(0.2)
    print(f"process {args.pid} still running after {args.timeout_s}s", file=sys.stderr)
    return 1
