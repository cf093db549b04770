"""A node's LoRA adapters as its servers use them: prefill and decode nodes (the decoder's
updates) and encoder nodes (the tower's) alike. Resolving a request's LoraRef to the node's own
copy, loading and unloading at runtime (the LoraAdapters service, services/transport/
lora_service.py), and the fingerprints its index record lists (routers prefer a node holding a
request's adapter). File reads run in worker threads, never on the node's event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from services.engine.engine import RequestRejectedError
from services.engine.lora.registry import LoraRegistry, LoraUnavailableError
from services.models.lora.adapter import LoraAdapter
from services.models.lora.files import LoraAdapterError, adapter_directory, adapter_fingerprint
from services.models.lora.modules import LoraModule
from shared.types import LoraRef


class MissingAdapterError(RequestRejectedError):
    """This node lacks the request's LoRA adapter, or holds another copy of it: the gateway may
    load it here and send the request again (ErrorKind.MISSING_ADAPTER)."""


class NodeAdapters:
    def __init__(self, registry: LoraRegistry | None, on_change: Callable[[], None] = lambda: None) -> None:
        """``registry``: None when the node serves no LoRA (no --enable-lora); ``on_change``:
        called after a load or unload (the node's record lists its adapters)."""
        self.registry = registry
        self.on_change = on_change

    async def resolve(self, lora: LoraRef | None) -> LoraAdapter | None:
        """The adapter a request names, as this node holds it; raises RequestRejectedError when
        it serves no LoRA at all or its copy disagrees with the caller's on the tower (a request
        keyed wrongly), MissingAdapterError when it lacks that adapter (another name, or another
        fingerprint: a stale copy)."""
        if lora is None:
            return None
        if self.registry is None:
            raise RequestRejectedError(f"LoRA adapter {lora.name!r} asked for, but this node serves none (start it with --enable-lora)")
        try:
            adapter = await asyncio.to_thread(self.registry.resolve, lora)  # it may read the adapter's files
        except LoraUnavailableError as exc:
            raise MissingAdapterError(str(exc)) from None
        if adapter is not None and adapter.touches_tower != lora.tower:
            raise RequestRejectedError(
                f"LoRA adapter {lora.name!r}: the request says it {'changes' if lora.tower else 'leaves'} the vision tower, "
                f"this node's copy {'changes' if adapter.touches_tower else 'leaves'} it"
            )
        return adapter

    async def load(self, name: str, path: str, fingerprint: str | None) -> LoraAdapter:
        """Serve the adapter at ``path`` under ``name`` (a runtime load); raises LoraAdapterError
        when this node serves no LoRA, the adapter does not fit this model, or its files are not
        the ones the caller fingerprinted (``fingerprint``; None: the first node asked, whose
        answer the others are held to)."""
        if self.registry is None:
            raise LoraAdapterError(f"this node serves no LoRA adapters (start it with --enable-lora); cannot load {name!r}")
        local = await asyncio.to_thread(adapter_directory, path)  # a Hub id is fetched: a thread's wait
        found = await asyncio.to_thread(adapter_fingerprint, local)
        if fingerprint is not None and found != fingerprint:
            raise LoraAdapterError(f"LoRA adapter {name!r}: the files at {path} on this node differ from the caller's")
        adapter = await asyncio.to_thread(self.registry.add, LoraModule(name, Path(path)))  # reading its tensors
        self.on_change()
        return adapter

    async def unload(self, name: str) -> bool:
        """Stop serving ``name`` to new requests; requests running with it finish with it (they
        hold the adapter)."""
        removed = self.registry is not None and self.registry.remove(name)
        self.on_change()
        return removed

    def fingerprints(self) -> frozenset[str]:
        registry = self.registry
        return frozenset() if registry is None else frozenset(f for name in registry.names() if (f := registry.fingerprint(name)))
