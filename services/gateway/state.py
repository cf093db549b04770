"""What the HTTP gateway's handlers share: the pipeline, the served model, metrics, the draining
flag, and the one way a choice's token events are produced (on a thread of its own)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

from services.gateway.event_bridge import iterate_in_thread
from services.gateway.in_flight import InFlightCalls
from services.gateway.metrics import GatewayMetrics, RoleCounters
from services.gateway.openai_api import Generation
from services.gateway.pipeline import Pipeline
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
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.metrics = GatewayMetrics(self.cluster_counters, lambda: float(self.num_in_flight), model_name=self.served_names[0])
        self.pipeline.route_observers.append(lambda route: self.metrics.record_route(route.decision_s))

    def cluster_counters(self) -> RoleCounters:
        """Every live node's counters (one Stats call each, so: blocking), and the gateway's own."""
        counters = {f"{role}@{address}": dict(s.counters) for role, address, s in self.pipeline.stats()}
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
        calls = InFlightCalls()

        def counted() -> Iterator[TokenEvent]:
            with self._lock:
                self.num_in_flight += 1
            try:
                yield from self.pipeline.run(
                    generation.preprocess_body,
                    generation.sampling,
                    cache_salt=generation.cache_salt,
                    stream=stream,
                    calls=calls,
                    fit_max_tokens=generation.fit_max_tokens,
                )
            finally:
                with self._lock:
                    self.num_in_flight -= 1

        return iterate_in_thread(counted, on_stop=calls.cancel)
