"""gRPC Encode service: converts at the edge and calls EncoderNode."""

from __future__ import annotations

import asyncio
import os

from protos.gen import pb, rpc
from services.encoder.node import EncodeItem, EncoderNode
from services.transport.grpc_server import Lifecycle, new_server, serve_forever
from services.transport.internal_auth import InternalAuth
from shared.types import MmHash


class EncodeServicer(rpc.EncodeServicer):
    def __init__(self, node: EncoderNode) -> None:
        self.node = node

    async def Encode(self, request: pb.EncodeRequest, context) -> pb.EncodeResponse:
        items = [EncodeItem(MmHash(i.mm_hash), i.length, tuple(i.grid_thw)) for i in request.items]
        result = await asyncio.to_thread(self.node.encode, items, request.target_data_address)
        return pb.EncodeResponse(missing_pixels=result.missing_pixels, num_encoded=result.num_encoded, num_cache_hits=result.num_cache_hits)

    async def Stats(self, request, context) -> pb.StatsResponse:
        return pb.StatsResponse(role="encoder", pid=os.getpid(), counters=self.node.counters(), data_address=self.node.data_address)


async def serve(node: EncoderNode, address: str, lifecycle: Lifecycle, auth: InternalAuth) -> None:
    server = new_server(auth)
    rpc.add_EncodeServicer_to_server(EncodeServicer(node), server)
    await serve_forever(server, address, ["tessera.v1.Encode"], lifecycle, auth)
