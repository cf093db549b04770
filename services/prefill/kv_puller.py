"""Pulling the prefix KV of a prompt from a peer the router named, when kv_pull's cost model says
that beats recomputing it. Pulled pages are filed under their block hashes as ordinary cached
blocks, so the engine's normal prefix lookup adopts them; a failed or late pull leaves them to be
recomputed, which is always correct."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from services.engine import connector, kv_pages
from services.engine.engine_loop import EngineLoop
from services.engine.request import Request
from services.prefill.job import Upstream
from services.prefill.kv_pull import KVSource, PullCostModel, blocks_to_pull, updated_rate
from services.transport.addresses import AdvertisedAddress
from shared.node_metrics import Counter, counter
from shared.types import BlockHash

# (key, timeout_s, sender) -> the pages pushed under key, None if they did not come, awaited on
# the serving loop: EngineNode.arrival_of_pages.
ArrivalOfPagesFn = Callable[[str, float, str], Awaitable[kv_pages.KVPages | None]]


@dataclass(frozen=True, slots=True)
class PullPlan:
    source: KVSource
    hashes: list[BlockHash]  # the blocks to ask the source for, in prompt order
    transfer_id: str


@dataclass(slots=True)
class PullMetrics:
    num_blocks_pulled: Counter = counter("prefill_kv_blocks_pulled_total", "KV blocks pulled from peers")
    num_failures: Counter = counter("prefill_kv_pull_failures_total", "Pulls whose peer failed or was late: their blocks were recomputed")
    # Pulling as a cache: blocks pulled from peers against blocks a planned pull did not bring.
    remote_kv_hits: Counter = counter("remote_kv_cache_hits_total", "KV blocks pulled from peers (prefill_kv_blocks_pulled_total)")
    num_blocks_missed: Counter = counter("remote_kv_cache_misses_total", "KV blocks a planned pull did not bring")

    def __post_init__(self) -> None:
        self.remote_kv_hits.read_from(lambda: self.num_blocks_pulled.value)


class KVPuller:
    def __init__(
        self,
        loop: EngineLoop,
        arrival_of_pages: ArrivalOfPagesFn,
        cost: PullCostModel,
        *,
        block_size: int,
        timeout_s: float,
        prefill_s_per_token: float,
    ) -> None:
        self.loop = loop
        self.arrival_of_pages = arrival_of_pages
        self.cost = cost
        self.block_size = block_size
        self.timeout_s = timeout_s
        self.prefill_s_per_token = prefill_s_per_token  # refined by every prefill (observe_prefill)
        self.metrics = PullMetrics()

    async def pull(self, request: Request, sources: Sequence[KVSource], upstream: Upstream, target: AdvertisedAddress) -> int:
        """Pull ``request``'s prefix pages to ``target`` (this node's inbox) if worth it; returns
        the number of prompt tokens pulled. Never raises for the peer's failure."""
        if not sources or request.computes_whole_prompt:  # it would use none of them
            return 0
        plan = await self.plan(request, sources)
        if plan is None:
            return 0
        num_blocks = await upstream.export_kv(plan.source.grpc_address, plan.hashes, target, plan.transfer_id, self.timeout_s)
        if num_blocks is None:
            self._record_failure(plan)
            return 0
        imported = await self.receive(plan, num_blocks)
        return imported * self.block_size

    async def plan(self, request: Request, sources: Sequence[KVSource]) -> PullPlan | None:
        """The pull worth making for ``request``, if any: from the source holding the longest
        prefix beyond ours, when the cost model says pulling beats recomputing."""
        hashes = request.update_block_hashes(self.block_size)
        if not sources or request.sampling.prompt_logprobs is not None:  # it computes its whole prompt
            return None
        source = max(sources, key=lambda s: s.num_tokens)  # a shorter prefix could only save less
        num_local = await asyncio.wrap_future(self.loop.call(lambda engine: connector.num_cached_blocks(engine, hashes)))
        wanted = blocks_to_pull(num_local, source, request.num_prompt_tokens, self.block_size)
        if not self.cost.should_pull(len(wanted) * self.block_size, self.prefill_s_per_token, self.block_size):
            return None
        return PullPlan(source, hashes[wanted.start : wanted.stop], f"kv-{uuid.uuid4().hex}")

    async def receive(self, plan: PullPlan, num_blocks: int) -> int:
        """Wait for the pages the source announced and file them as cached blocks; returns the
        number imported (0 on timeout: the prompt is then recomputed)."""
        if num_blocks == 0:
            self.metrics.num_blocks_missed.inc(len(plan.hashes))
            return 0  # the source no longer held them: nothing was sent
        pages = await self.arrival_of_pages(plan.transfer_id, self.timeout_s, plan.source.grpc_address)
        if pages is None:
            self._record_failure(plan)
            return 0
        hashes = plan.hashes[:num_blocks]
        imported = await asyncio.wrap_future(self.loop.call(lambda engine: connector.import_blocks(engine, hashes, pages)))
        self.metrics.num_blocks_pulled.inc(imported)
        self.metrics.num_blocks_missed.inc(len(plan.hashes) - imported)
        return imported

    def observe_prefill(self, elapsed_s: float, num_computed: int) -> None:
        """Fold a finished prefill into the recompute side of the cost model."""
        self.prefill_s_per_token = updated_rate(self.prefill_s_per_token, elapsed_s, num_computed)

    def _record_failure(self, plan: PullPlan) -> None:
        self.metrics.num_failures.inc()
        self.metrics.num_blocks_missed.inc(len(plan.hashes))
