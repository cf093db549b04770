"""Loading a request's LoRA adapter on a node that lacked it (the node's MISSING_ADAPTER: it
started after the adapter was loaded at runtime), then trying again: once per node per request,
so a node that keeps refusing is tried no more than a busy one would be."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from services.gateway.pipeline.request_run import RequestRun
from shared.types import LoraRef

log = logging.getLogger("tessera.gateway")


class AdapterLoads:
    def __init__(self) -> None:
        # (node address, adapter) -> loaded; set by the frontend (services/gateway/frontend/adapter_updates.py).
        self.loader: Callable[[str, LoraRef], Awaitable[None]] | None = None
        self.num_loads = 0

    async def load(self, run: RequestRun, address: str) -> bool:
        """Load ``run``'s adapter on the node at ``address``; False when there is nothing to
        load, it was tried there already for this request, or the load failed."""
        if self.loader is None or run.lora is None or address in run.adapter_loads:
            return False
        run.adapter_loads.add(address)
        try:
            await self.loader(address, run.lora)
        except Exception as exc:  # the node's refusal, or no answer: another node instead
            log.warning("loading LoRA adapter %r on %s failed: %s", run.lora.name, address, exc)
            return False
        self.num_loads += 1
        return True
