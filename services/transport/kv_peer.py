"""gRPC KVPeer service, served by prefill and decode nodes: sends cached prefix pages to a
puller's data address. Thin: converts at the edge and calls the node's export_kv."""

from __future__ import annotations

from typing import Protocol

from protos.gen import pb, rpc
from shared.types import BlockHash


class KVExporter(Protocol):
    async def export_kv(self, hashes: list[BlockHash], target: str, transfer_id: str) -> int:
        """Push the leading held blocks of ``hashes`` to ``target``; returns how many."""


class KVPeerServicer(rpc.KVPeerServicer):
    def __init__(self, node: KVExporter) -> None:
        self.node = node

    async def ExportKV(self, request: pb.ExportKVRequest, context) -> pb.ExportKVResponse:
        hashes = [BlockHash(h) for h in request.block_hashes]
        num_blocks = await self.node.export_kv(hashes, request.target_data_address, request.transfer_id)
        return pb.ExportKVResponse(num_blocks=num_blocks)


def add_kv_peer(server, node: KVExporter) -> str:
    """Register the service on ``server``; returns its name for health and reflection."""
    rpc.add_KVPeerServicer_to_server(KVPeerServicer(node), server)
    return "tessera.v1.KVPeer"
