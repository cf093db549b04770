"""What the gateway's doors share: the pipeline, the configuration, metrics, the media budget, the
draining flag, and the one way a choice's token events are produced (in a task of its own)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from services.gateway.frontend.config import FrontendConfig
from services.gateway.frontend.media_budget import MediaBudget
from services.gateway.frontend.openai_api import Generation
from services.gateway.metrics.metrics import GatewayMetrics, RoleStats
from services.gateway.pipeline.choices import events_in_task
from services.gateway.pipeline.pipeline import Pipeline
from services.gateway.pipeline.token_events import TokenEvent
from services.transport.stats_wire import snapshot_of
from shared.node_metrics import Counter, Gauge, counter, gauge
from shared.process_stats import node_snapshot


@dataclass(slots=True)
class GatewayNodeMetrics:
    """The gateway's own part of the cluster view, read from its pipeline and router."""

    num_node_failures: Counter = counter("gateway_node_failures_total", "Node failures a request was retried past")
    num_migrations: Counter = counter("gateway_migrations_total", "Streams moved to another decode node after tokens went out")
    num_busy_refusals: Counter = counter("gateway_node_busy_refusals_total", "Calls a busy node refused (tried elsewhere, or a 429)")
    num_adapter_loads: Counter = counter(
        "gateway_lora_adapter_loads_total",
        "LoRA adapters loaded on a node that lacked one a request needed (it started after a runtime load)",
    )
    num_index_errors: Counter = counter("gateway_index_errors_total", "Index lookups that failed: routed without cache hits")
    num_local_encode_routes: Counter = counter("gateway_local_encode_routes_total", "Requests whose images a prefill node encodes")
    num_images_covered: Counter = counter(
        "gateway_images_covered_total", "Images the chosen prefill node's cached prefix covered: no pixels moved, no tower run"
    )
    num_cover_fallbacks: Counter = counter(
        "gateway_cover_fallbacks_total", "Requests whose covered images were needed after all (their prefix was evicted first)"
    )
    index_breaker_open: Gauge = gauge("gateway_index_breaker_open", "1 while the index's breaker holds calls back (no cache lookups)")
    media_cost_inflight: Gauge = gauge("media_cost_inflight", "Vision tokens admitted and not yet encoded (the media budget's use)")
    media_tower_seconds_inflight: Gauge = gauge(
        "media_tower_seconds_inflight", "Expected vision-tower seconds of the media in flight, at the encoders' measured rate"
    )
    num_media_refusals: Counter = counter("media_budget_refusals_total", "Requests refused with a 429: the media budget was spent")
    num_media_too_large: Counter = counter("media_too_large_total", "Requests refused with a 413: more media than the whole budget")


@dataclass(slots=True)
class GatewayState:
    pipeline: Pipeline
    config: FrontendConfig
    started: int  # when the gateway started (unix seconds): /v1/models' created
    metrics: GatewayMetrics = field(init=False)
    draining: bool = False
    num_in_flight: int = 0  # choices whose pipeline run is in progress
    media: MediaBudget = field(init=False)
    own_metrics: GatewayNodeMetrics = field(init=False, default_factory=GatewayNodeMetrics)
    _scraped: RoleStats = field(default_factory=dict)  # the metrics the next render reports

    def __post_init__(self) -> None:
        config = self.config
        self.metrics = GatewayMetrics(
            lambda: self._scraped, lambda: float(self.num_in_flight), model_name=config.served_names[0], vllm_names=config.vllm_metric_names
        )
        self.pipeline.route_observers.append(lambda route: self.metrics.record_route(route.decision_s))
        pipeline, own = self.pipeline, self.own_metrics
        own.num_node_failures.read_from(lambda: pipeline.num_retries)
        own.num_migrations.read_from(lambda: pipeline.num_migrations)
        own.num_busy_refusals.read_from(lambda: pipeline.num_busy_refusals)
        own.num_adapter_loads.read_from(lambda: pipeline.adapter_loads.num_loads)
        own.num_index_errors.read_from(lambda: pipeline.router.num_index_failures)
        own.num_local_encode_routes.read_from(lambda: pipeline.router.num_local_encodes)
        own.num_images_covered.read_from(lambda: pipeline.router.num_images_covered)
        own.num_cover_fallbacks.read_from(lambda: pipeline.stages.num_cover_fallbacks)
        own.index_breaker_open.read_from(self._index_breaker_open)
        media = self.media = MediaBudget(
            self.config.max_media_tokens_per_encoder,
            lambda: len(pipeline.membership.nodes("encoder")),
            lambda: pipeline.media_cost_json(),
            lambda: pipeline.tower_seconds_per_token(),
            reserve_fraction=self.config.media_reserve_fraction,
        )
        own.media_cost_inflight.read_from(lambda: media.num_in_flight)
        own.media_tower_seconds_inflight.read_from(lambda: media.tower_seconds_in_flight)
        own.num_media_refusals.read_from(lambda: media.num_refused)
        own.num_media_too_large.read_from(lambda: media.num_too_large)

    async def render_metrics(self) -> bytes:
        """/metrics: every live node's metrics, asked for now, with the gateway's own."""
        self._scraped = await self.cluster_stats()
        return self.metrics.render()

    async def cluster_stats(self) -> RoleStats:
        """Every live node's metrics (one Stats call each, all at once), and the gateway's own with
        its process's (e.g. index records rejected, shared/index/record_seal.py)."""
        stats = {f"{role}@{address}": snapshot_of(s) for role, address, s in await self.pipeline.stats()}
        stats["gateway@self"] = node_snapshot(self.own_metrics)
        return stats

    def _index_breaker_open(self) -> float:
        breaker = getattr(self.pipeline.router.index or self.pipeline.membership.index, "breaker", None)
        return float(breaker is not None and breaker.state != "closed")

    def events(self, generation: Generation, *, stream: bool, request_id: str | None = None) -> AsyncIterator[TokenEvent]:
        """One choice's token events. Closing the iterator early cancels its work on every node.
        ``request_id``: the id nodes key the choice's work by (one of its own when None)."""

        async def counted() -> AsyncIterator[TokenEvent]:
            self.num_in_flight += 1
            try:
                async for event in self.pipeline.run(
                    generation.prompt,
                    generation.sampling,
                    cache_salt=generation.cache_salt,
                    lora=generation.lora,
                    stream=stream,
                    fit_max_tokens=generation.fit_max_tokens,
                    request_id=request_id,
                ):
                    yield event
            finally:
                self.num_in_flight -= 1

        return events_in_task(counted)
