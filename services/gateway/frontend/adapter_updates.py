"""Loading and unloading LoRA adapters at runtime, as vLLM's /v1/load_lora_adapter and
/v1/unload_lora_adapter do, under vLLM's switch (VLLM_ALLOW_RUNTIME_LORA_UPDATING).

Placement: a load puts the adapter on one prefill node and one decode node, the least loaded
of each role (fewest adapters among equals, so adapters spread over the nodes), and, for an
adapter that changes the vision tower (the first node says so), on one encoder. Their index
records then list it (shared/index/types.py NodeState.adapters), the load waits (bounded) until
this gateway's membership sees that, and the router prefers those nodes for the adapter's
requests (services/router/scoring.py, ADAPTER_WEIGHT). A request routed to a node without it
(the holders busy, or gone) has the pipeline load it there first (``load_on``), so the adapter
spreads with its traffic. Without an index no record says where it is, and it spreads the same
way.

The first node reads and fingerprints the files (the gateway reads no file on its loop, and
starts no thread), the other is held to that fingerprint, and only then is the name served. A
node that refuses it (not an adapter for this model, other files at that path) fails the load
with its reason, and a node that took it drops it again. An unload stops serving the name first,
then every node drops it; requests already running with it finish with it."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import grpc

from protos.gen import pb
from services.gateway.errors import GatewayError
from services.gateway.frontend.served_adapters import ServedAdapters
from services.models.lora.modules import LoraModule
from shared.index.types import NodeState
from shared.tracing import outgoing_metadata
from shared.types import LoraRef

log = logging.getLogger("tessera.gateway")

RUNTIME_UPDATES_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
CALL_TIMEOUT_S = 60.0  # a node reads the adapter's tensors before it answers
ADAPTER_ROLES = ("prefill", "decode")  # and an encoder, for an adapter that changes the tower
# How long a load waits for this gateway's membership to list the adapter on the nodes that took
# it (a node's record changes at once, a membership refresh reads it): tries x pause, bounded.
RECORD_WAIT_TRIES = 40
RECORD_WAIT_PAUSE_S = 0.05


def runtime_updates_allowed(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(RUNTIME_UPDATES_ENV, "").strip().lower() in ("1", "true", "yes", "on")


class AdapterUpdates:
    def __init__(
        self,
        adapters: ServedAdapters,
        nodes: Callable[[str], list[str]],
        stub: Callable[[str], object],
        *,
        placement: Callable[[str], str | None] = lambda role: None,
        recorded: Callable[[list[str], str], Awaitable[bool]] | None = None,
    ) -> None:
        """``nodes(role)``: the live nodes' gRPC addresses; ``stub(address)``: a LoraAdapters
        stub; ``placement(role)``: the node of the role a load goes to (None: the first live
        one); ``recorded(addresses, fingerprint)``: wait until the membership lists the adapter
        on those nodes, True once it does."""
        self.adapters = adapters
        self.nodes = nodes
        self.stub = stub
        self.placement = placement
        self.recorded = recorded

    async def load(self, name: str, path: str, *, inplace: bool = False) -> str:
        if not self.adapters.enabled:
            raise GatewayError(400, "LoRA is off on this server: start it with --enable-lora", param="lora_name")
        if name in self.adapters and not inplace:
            raise GatewayError(
                400,
                f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.",
                param="lora_name",
            )
        addresses = self._placed(ADAPTER_ROLES)
        if not addresses:
            raise GatewayError(503, "no prefill or decode node is live to load the adapter on; retry")
        loaded: list[str] = []
        fingerprint, tower = await self._load_each(name, path, addresses, "", loaded)
        if not loaded:
            raise GatewayError(503, "no prefill or decode node answered the load; retry")
        if tower:  # its image embeddings are its own: an encoder runs it too
            await self._load_each(name, path, self._placed(("encoder",)), fingerprint, loaded)
        if self.recorded is not None and not await self.recorded(loaded, fingerprint):
            log.warning("LoRA adapter %r: the index does not list it on %s yet; routing finds it when it does", name, loaded)
        self.adapters.add(LoraModule(name, Path(path)), fingerprint, tower=tower)
        return f"Success: LoRA adapter '{name}' added successfully."

    async def _load_each(self, name: str, path: str, addresses: list[str], fingerprint: str, loaded: list[str]) -> tuple[str, bool]:
        """Load the adapter on each of ``addresses`` (appended to ``loaded`` as they take it),
        held to ``fingerprint`` (empty: the first node's answer, which the others are held to);
        its fingerprint, and whether it changes the tower. A refusal drops it from the nodes
        that took it and is the caller's 400."""
        tower = False
        for address in addresses:
            try:
                request = pb.LoadLoraRequest(name=name, path=path, fingerprint=fingerprint)
                answer = await self.stub(address).Load(request, **self._call())
                fingerprint, tower = answer.fingerprint, answer.tower
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    await self._refused(name, loaded, replacing=name in self.adapters)
                    raise GatewayError(400, f"node {address} refused the adapter: {exc.details()}", param="lora_path") from None
                log.warning("loading LoRA adapter %r: node %s did not answer (%s); it will not serve it", name, address, exc.code())
                continue
            loaded.append(address)
        return fingerprint, tower

    async def _refused(self, name: str, loaded: list[str], *, replacing: bool) -> None:
        """A node refused the adapter: the nodes that took it drop it again. An in-place load
        that fails has left those nodes without the copy the API serves, so the name is no
        longer served anywhere (a client loads it again) rather than served by some nodes only."""
        if replacing:
            self.adapters.remove(name)
            loaded = self._addresses()
        await self._drop(name, loaded)

    async def load_on(self, address: str, lora: LoraRef) -> None:
        """Load ``lora`` on the one node at ``address``, which lacked it (it started after the
        adapter was loaded at runtime); raises when the API no longer serves that adapter, or the
        node refuses it."""
        served = self.adapters.by_name.get(lora.name)
        if served is None or served.ref != lora:
            raise GatewayError(404, f"The lora adapter '{lora.name}' cannot be found.", code="model_not_found", param="model")
        request = pb.LoadLoraRequest(name=lora.name, path=str(served.path), fingerprint=lora.fingerprint)
        await self.stub(address).Load(request, **self._call())
        log.info("loaded LoRA adapter %r on %s, which lacked it", lora.name, address)

    @classmethod
    def for_pipeline(cls, adapters: ServedAdapters, pipeline) -> AdapterUpdates:
        """Over ``pipeline``'s membership and stubs (services/gateway/pipeline/pipeline.py)."""

        membership = pipeline.membership

        def nodes(role: str) -> list[str]:
            return [state.info.grpc_address for state in membership.nodes(role)]

        def placement(role: str) -> str | None:
            def busy(state: NodeState) -> tuple:
                address = state.info.grpc_address
                return max(state.load, membership.num_in_flight(address)), len(state.adapters), address

            chosen = min(membership.nodes(role), key=busy, default=None)
            return None if chosen is None else chosen.info.grpc_address

        async def recorded(addresses: list[str], fingerprint: str) -> bool:
            if membership.index is None:  # static membership: no records to wait for
                return True
            for _ in range(RECORD_WAIT_TRIES):
                await membership.refresh()
                states = [membership.find(address) for address in addresses]
                if all(state is None or fingerprint in state.adapters for state in states):
                    return True
                await asyncio.sleep(RECORD_WAIT_PAUSE_S)
            return False

        def stub(address: str) -> object:
            return pipeline.stub("lora_adapters", address)

        return cls(adapters, nodes, stub, placement=placement, recorded=recorded)

    async def unload(self, name: str) -> str:
        if self.adapters.remove(name) is None:
            raise GatewayError(404, f"The lora adapter '{name}' cannot be found.", code="model_not_found", param="lora_name")
        await self._drop(name, self._addresses())
        return f"Success: LoRA adapter '{name}' removed successfully."

    async def _drop(self, name: str, addresses: list[str]) -> None:
        for address in addresses:
            try:
                await self.stub(address).Unload(pb.UnloadLoraRequest(name=name), **self._call())
            except grpc.RpcError as exc:  # a node gone keeps nothing; one that stays serves no request naming it
                log.warning("unloading LoRA adapter %r: node %s did not answer (%s)", name, address, exc.code())

    def _addresses(self) -> list[str]:
        return [address for role in (*ADAPTER_ROLES, "encoder") for address in self.nodes(role)]

    def _placed(self, roles: tuple[str, ...]) -> list[str]:
        """The node of each role a load goes to (placement's, else the role's first live one)."""
        chosen = [self.placement(role) or next(iter(self.nodes(role)), None) for role in roles]
        return [address for address in chosen if address is not None]

    @staticmethod
    def _call() -> dict:
        return {"timeout": CALL_TIMEOUT_S, "metadata": outgoing_metadata()}
