"""gRPC KVPeer service, served by prefill and decode nodes: sends cached prefix pages to a
puller's data address. Thin: converts at the edge and calls EngineNode.export_kv."""

from __future__ import annotations

import asyncio

from protos.gen import pb, rpc
from services.engine.engine_node import EngineNode
from shared.types import BlockHash


class KVPeerServicer(rpc.KVPeerServicer):
    def __init__(self, node: EngineNode) -> None:
        self.node = node

    async def ExportKV(self, request: pb.ExportKVRequest, context) -> pb.ExportKVResponse:
        hashes = [BlockHash(h) for h in request.block_hashes]
        num_blocks = await asyncio.to_thread(self.node.export_kv, hashes, request.target_data_address, request.transfer_id)
        return pb.ExportKVResponse(num_blocks=num_blocks)


def add_kv_peer(server, node: EngineNode) -> str:
    """Register the service on ``server``; returns its name for health and reflection."""
    rpc.add_KVPeerServicer_to_server(KVPeerServicer(node), server)
    return "tessera.v1.KVPeer"
