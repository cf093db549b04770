"""What the HTTP gateway's handlers share: the pipeline, the served model, metrics, the draining
flag, and the one way a choice's token events are produced (in a task of its own)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from services.gateway.metrics import GatewayMetrics, RoleCounters
from services.gateway.openai_api import Generation
from services.gateway.pipeline import Pipeline
from services.gateway.request_task import events_in_task
from services.gateway.token_events import TokenEvent
from shared.process_stats import process_counters


@dataclass(slots=True)
class GatewayState:
    pipeline: Pipeline
    served_names: tuple[str, ...]  # the names the API answers to; the first is the default
    default_max_tokens: int
    started: int
    metrics: GatewayMetrics = field(init=False)
    draining: bool = False
    num_in_flight: int = 0  # choices whose pipeline run is in progress
    _scraped: RoleCounters = field(default_factory=dict)  # the counters the next render reports

    def __post_init__(self) -> None:
        self.metrics = GatewayMetrics(lambda: self._scraped, lambda: float(self.num_in_flight), model_name=self.served_names[0])
        self.pipeline.route_observers.append(lambda route: self.metrics.record_route(route.decision_s))

    async def render_metrics(self) -> bytes:
        """/metrics: every live node's counters, asked for now, with the gateway's own."""
        self._scraped = await self.cluster_counters()
        return self.metrics.render()

    async def cluster_counters(self) -> RoleCounters:
        """Every live node's counters (one Stats call each, all at once), and the gateway's own."""
        counters = {f"{role}@{address}": dict(s.counters) for role, address, s in await self.pipeline.stats()}
        router = self.pipeline.router
        breaker = getattr(router.index or self.pipeline.membership.index, "breaker", None)
        counters["gateway@self"] = {
            "gateway_node_failures_total": float(self.pipeline.num_retries),
            "gateway_migrations_total": float(self.pipeline.num_migrations),
            "gateway_node_busy_refusals_total": float(self.pipeline.num_busy_refusals),
            "gateway_index_errors_total": float(router.num_index_failures),
            "gateway_local_encode_routes_total": float(router.num_local_encodes),
            # 1 while the index's circuit breaker holds calls back (routing without cache lookups).
            "gateway_index_breaker_open": float(breaker is not None and breaker.state != "closed"),
            **process_counters(),  # e.g. index records rejected (shared/index/record_seal.py)
        }
        return counters

    def events(self, generation: Generation, *, stream: bool) -> AsyncIterator[TokenEvent]:
        """One choice's token events. Closing the iterator early cancels its work on every node."""

        async def counted() -> AsyncIterator[TokenEvent]:
            self.num_in_flight += 1
            try:
                async for event in self.pipeline.run(
                    generation.prompt,
                    generation.sampling,
                    cache_salt=generation.cache_salt,
                    stream=stream,
                    fit_max_tokens=generation.fit_max_tokens,
                ):
                    yield event
            finally:
                self.num_in_flight -= 1

        return events_in_task(counted)
