"""gRPC LoraAdapters service, served by prefill, decode and encoder nodes: load and unload LoRA
adapters at runtime. Thin: converts at the edge and calls the node, whose errors map to statuses here."""

from __future__ import annotations

from typing import Protocol

import grpc

from protos.gen import pb, rpc


class LoadedAdapter(Protocol):
    fingerprint: str
    touches_tower: bool


class AdapterHolder(Protocol):
    async def load(self, name: str, path: str, fingerprint: str | None) -> LoadedAdapter:
        """Serve the adapter at ``path`` under ``name`` and return it; raises ValueError when it
        cannot (not an adapter, not for this model, or not the files the caller fingerprinted)."""

    async def unload(self, name: str) -> bool:
        """Stop serving ``name``; False when it was not served."""


class LoraAdaptersServicer(rpc.LoraAdaptersServicer):
    def __init__(self, adapters: AdapterHolder) -> None:
        self.adapters = adapters

    async def Load(self, request: pb.LoadLoraRequest, context) -> pb.LoadLoraResponse:
        try:
            adapter = await self.adapters.load(request.name, request.path, request.fingerprint or None)
        except ValueError as exc:  # the node's reason the adapter cannot be served
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return pb.LoadLoraResponse(fingerprint=adapter.fingerprint, tower=adapter.touches_tower)

    async def Unload(self, request: pb.UnloadLoraRequest, context) -> pb.UnloadLoraResponse:
        return pb.UnloadLoraResponse(unloaded=await self.adapters.unload(request.name))


def add_lora_adapters(server, adapters: AdapterHolder) -> str:
    """Register the service on ``server`` over a node's adapters (services/engine/lora/
    node_adapters.py); returns its name for health and reflection."""
    rpc.add_LoraAdaptersServicer_to_server(LoraAdaptersServicer(adapters), server)
    return "tessera.v1.LoraAdapters"
