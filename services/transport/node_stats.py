"""A node's Stats, asked over the internal plane by a tool that runs outside an event loop (the
CLI, a benchmark's sampling thread, a test): one short-lived grpc.aio channel per call, run to
completion on a loop of its own. Stats is an internal call, so ``auth`` must carry the cluster's
credentials."""

from __future__ import annotations

import asyncio

from protos.gen import pb
from services.transport.internal_auth import InternalAuth
from services.transport.internal_channel import ROLE_TO_STUB, internal_channel


async def fetch_stats(role: str, address: str, auth: InternalAuth, *, timeout_s: float = 10.0) -> pb.StatsResponse:
    async with internal_channel(address, auth) as channel:
        return await ROLE_TO_STUB[role](channel).Stats(pb.StatsRequest(), timeout=timeout_s)


def read_stats(role: str, address: str, auth: InternalAuth, *, timeout_s: float = 10.0) -> pb.StatsResponse:
    """``fetch_stats`` for a caller with no running event loop; raises grpc.RpcError as the call does."""
    return asyncio.run(fetch_stats(role, address, auth, timeout_s=timeout_s))
