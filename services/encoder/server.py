"""gRPC Encode service: converts at the edge and calls EncoderNode.

Calls take turns here, before reaching the node: the node runs one encode at a time on its compute
thread anyway, and a call waiting on this lock, unlike one queued on the compute thread, leaves the
line when it goes away (cancelled, or past its deadline), so its images are never encoded for
nobody. An encode that fails fails its own call only, as the request's error (500, not retried):
its inputs are what failed, and the node goes on serving the next call.
"""

from __future__ import annotations

import asyncio
import os

import grpc

from protos.gen import pb, rpc
from services.encoder.node import EncodeItem, EncoderNode
from services.transport.grpc_server import Lifecycle, abort_with, new_server, serve_forever
from services.transport.internal_auth import InternalAuth
from services.transport.node_admission import NodeAdmission
from shared.types import MmHash


class EncodeServicer(rpc.EncodeServicer):
    def __init__(self, node: EncoderNode, admission: NodeAdmission) -> None:
        self.node = node
        self.admission = admission
        self._turn = asyncio.Lock()  # first come, first served

    async def Encode(self, request: pb.EncodeRequest, context) -> pb.EncodeResponse:
        items = [EncodeItem(MmHash(i.mm_hash), i.length, tuple(i.grid_thw)) for i in request.items]
        async with self.admission.admitted(context), self._turn:
            # A call whose deadline passed while it waited its turn is not encoded: gRPC cancels
            # its task too, but under load that may land only after the turn was taken.
            remaining = context.time_remaining()
            if remaining is not None and remaining <= 0:
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the call's deadline passed while it waited its turn")
            try:
                result = await asyncio.to_thread(self.node.encode, items, request.target_data_address)
            except Exception as exc:
                await abort_with(context, grpc.StatusCode.INTERNAL, f"encoding failed for this request: {exc}", 500)
        return pb.EncodeResponse(missing_pixels=result.missing_pixels, num_encoded=result.num_encoded, num_cache_hits=result.num_cache_hits)

    async def Stats(self, request, context) -> pb.StatsResponse:
        counters = {**self.node.counters(), **self.admission.counters()}
        return pb.StatsResponse(role="encoder", pid=os.getpid(), counters=counters, data_address=self.node.data_address)


async def serve(node: EncoderNode, address: str, lifecycle: Lifecycle, auth: InternalAuth, admission: NodeAdmission) -> None:
    server = new_server(auth)
    rpc.add_EncodeServicer_to_server(EncodeServicer(node, admission), server)
    await serve_forever(server, address, ["tessera.v1.Encode"], lifecycle, auth)
