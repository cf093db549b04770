"""The gateway's /metrics, with prometheus_client: its own request counter and latency histograms
(TTFT, inter-token latency, end-to-end), plus, gathered at scrape time with the Stats RPC, every
node's counters and gauges summed per name, its histograms (each role's queue time,
``tessera_queue_seconds{role}``) summed per role, and a ``tessera_node_up`` per live node, each of
the kind the node's typed Stats reply gives it (shared/node_metrics.py). Those names start
``tessera_``; the cumulative sums never decrease when a node leaves (cluster_sums.py). Each node
also serves its own metrics (services/transport/metrics_http.py) for a Prometheus that scrapes
pods directly; this view is the one-URL summary of the whole cluster.

Beside them, the families vLLM's dashboards, KEDA triggers and the Gateway API Inference
Extension read, under vLLM's names with ``tessera:`` for ``vllm:`` (and under ``vllm:`` too with
``vllm_metric_names``), each labelled ``model_name``
(the mapping table is in the README): requests running and waiting on the engines, KV-cache usage
(0 to 1), prompt and generation tokens, successes by finish reason, and the TTFT, inter-token,
end-to-end and queue-time histograms. Process metrics (CPU, memory, file descriptors) come from
prometheus_client's own collectors."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from services.gateway.metrics.cluster_sums import RETIRED, ClusterSums
from shared.node_metrics import HistogramValue, Snapshot

TTFT_BUCKETS_S = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS_S = (0.005, 0.01, 0.02, 0.04, 0.06, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
ROUTE_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

# "role@address" -> its metrics, one entry per node that answered Stats (and the gateway's own).
RoleStats = dict[str, Snapshot]


ENGINE_ROLES = ("prefill", "decode")  # the roles whose engines hold requests and KV pages


class GatewayMetrics:
    def __init__(
        self,
        role_stats: Callable[[], RoleStats] = dict,
        num_in_flight: Callable[[], float] = lambda: 0.0,
        model_name: str = "",
        *,
        vllm_names: bool = False,
    ) -> None:
        self.model_name = model_name
        # Serve the vLLM-named families under ``vllm:`` too, for tools that read those names.
        self.vllm_names = vllm_names
        self.registry = CollectorRegistry(auto_describe=True)
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            self.registry.register(collector)
        self.requests = Counter("tessera_requests", "Chat requests by HTTP status", ["status"], registry=self.registry)
        self.ttft = Histogram("tessera_ttft_seconds", "Time to first token", buckets=TTFT_BUCKETS_S, registry=self.registry)
        self.itl = Histogram(
            "tessera_inter_token_latency_seconds", "Time between streamed tokens", buckets=ITL_BUCKETS_S, registry=self.registry
        )
        self.e2e = Histogram("tessera_e2e_latency_seconds", "Request arrival to last token", buckets=E2E_BUCKETS_S, registry=self.registry)
        self.route = Histogram(
            "tessera_route_decision_seconds",
            "Routing decision, including its one index lookup",
            buckets=ROUTE_BUCKETS_S,
            registry=self.registry,
        )
        in_flight = Gauge("tessera_requests_in_flight", "Requests whose pipeline is running", registry=self.registry)
        in_flight.set_function(num_in_flight)
        model = ["model_name"]
        self.prompt_tokens = Counter("tessera:prompt_tokens", "Prompt tokens of finished requests", model, registry=self.registry)
        self.generation_tokens = Counter("tessera:generation_tokens", "Generated tokens", model, registry=self.registry)
        self.success = Counter(
            "tessera:request_success", "Finished requests by finish reason", [*model, "finished_reason"], registry=self.registry
        )
        self.vllm_ttft = Histogram(
            "tessera:time_to_first_token_seconds", "Time to first token", model, buckets=TTFT_BUCKETS_S, registry=self.registry
        )
        self.vllm_itl = Histogram(
            "tessera:inter_token_latency_seconds", "Time between streamed tokens", model, buckets=ITL_BUCKETS_S, registry=self.registry
        )
        self.vllm_e2e = Histogram(
            "tessera:e2e_request_latency_seconds", "Request arrival to last token", model, buckets=E2E_BUCKETS_S, registry=self.registry
        )
        for family in (self.prompt_tokens, self.generation_tokens, self.vllm_ttft, self.vllm_itl, self.vllm_e2e):
            family.labels(model_name)  # served from the start, as zeros, like vLLM's
        # This model's series, looked up once: the inter-token one is observed for every streamed token.
        self.model_ttft, self.model_itl, self.model_e2e = (h.labels(model_name) for h in (self.vllm_ttft, self.vllm_itl, self.vllm_e2e))
        self.model_prompt_tokens = self.prompt_tokens.labels(model_name)
        self.model_generation_tokens = self.generation_tokens.labels(model_name)
        # Labelled children met so far: few (HTTP statuses, finish reasons), and a lookup costs
        # more than the increment it serves.
        self._status_to_requests: dict[int, Counter] = {}
        self._reason_to_success: dict[str, Counter] = {}
        self.registry.register(_ClusterCollector(role_stats, model_name))

    def record_request(self, status: int) -> None:
        child = self._status_to_requests.get(status)
        if child is None:
            child = self._status_to_requests[status] = self.requests.labels(status=str(status))
        child.inc()

    def record_ttft(self, seconds: float) -> None:
        self.ttft.observe(seconds)
        self.model_ttft.observe(seconds)

    def record_tokens(self, seconds: float, num_tokens: int) -> None:
        """``num_tokens`` arrived together ``seconds`` after the previous ones: each is one gap."""
        gap_s = seconds / num_tokens
        for _ in range(num_tokens):
            self.itl.observe(gap_s)
            self.model_itl.observe(gap_s)

    def record_e2e(self, seconds: float) -> None:
        self.e2e.observe(seconds)
        self.model_e2e.observe(seconds)

    def record_finished(self, prompt_tokens: int, generation_tokens: int, finish_reasons: list[str]) -> None:
        """A request that ran to its end: its usage, and each choice's finish reason."""
        self.model_prompt_tokens.inc(prompt_tokens)
        self.model_generation_tokens.inc(generation_tokens)
        for reason in finish_reasons:
            child = self._reason_to_success.get(reason)
            if child is None:
                child = self._reason_to_success[reason] = self.success.labels(self.model_name, reason)
            child.inc()

    def record_route(self, seconds: float) -> None:
        self.route.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(_WithVllmNames(self.registry) if self.vllm_names else self.registry)


class _WithVllmNames:
    """A registry's families, and each ``tessera:`` one again under ``vllm:`` (one collection:
    the cluster's statistics are read once per scrape)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self.registry.collect():
            yield metric
            if metric.name.startswith("tessera:"):
                yield _renamed(metric, "vllm:" + metric.name.removeprefix("tessera:"))


def _renamed(metric: Metric, name: str) -> Metric:
    copy = Metric(name, metric.documentation, metric.type, metric.unit)
    copy.samples = [sample._replace(name=name + sample.name[len(metric.name) :]) for sample in metric.samples]
    return copy


class _ClusterCollector(Collector):
    def __init__(self, role_stats: Callable[[], RoleStats], model_name: str) -> None:
        self.role_stats = role_stats
        self.model_name = model_name
        self.sums = ClusterSums()

    def describe(self) -> list[Metric]:
        return []  # dynamic: the names depend on which roles answer

    def collect(self) -> Iterator[Metric]:
        live = self.role_stats()
        reported = self.sums.update(live)
        counters: dict[str, float] = {}
        gauges: dict[str, float] = {}
        name_to_role_histogram: dict[str, dict[str, HistogramValue]] = {}  # summed per role, bucket by bucket
        up = GaugeMetricFamily("tessera_node_up", "A node that answered the scrape's Stats call", labels=["role", "address"])
        for node, stats in sorted(reported.items()):
            role, _, address = node.partition("@")
            for total, values in ((counters, stats.counters), (gauges, stats.gauges)):
                for name, value in values.items():
                    total[name] = total.get(name, 0.0) + value
            for name, value in stats.histograms.items():
                role_to_histogram = name_to_role_histogram.setdefault(name, {})
                summed = role_to_histogram.get(role)
                if summed is None:
                    role_to_histogram[role] = value
                elif summed.bounds == value.bounds:  # else a node of another version: left out until they agree
                    role_to_histogram[role] = summed + value
            if node in live and address != RETIRED:
                up.add_metric([role, address], 1.0)
        yield up
        for name, role_to_histogram in sorted(name_to_role_histogram.items()):
            family = HistogramMetricFamily(f"tessera_{name}", "Summed over each role's nodes", labels=["role"])
            for role, value in sorted(role_to_histogram.items()):
                family.add_metric([role], value.buckets(), sum_value=value.sum)
            yield family
        for name, value in sorted(counters.items()):
            yield CounterMetricFamily(f"tessera_{name}", "Summed over the nodes", value=value)
        for name, value in sorted(gauges.items()):
            yield GaugeMetricFamily(f"tessera_{name}", "Summed over the nodes that answered", value=value)
        yield from self._vllm_families(live, name_to_role_histogram)

    def _vllm_families(self, live: RoleStats, name_to_role_histogram: dict[str, dict[str, HistogramValue]]) -> Iterator[Metric]:
        """vLLM's engine gauges and queue histogram, from the engines' own statistics."""
        engines = [stats.gauges for node, stats in live.items() if node.partition("@")[0] in ENGINE_ROLES]
        labels = [self.model_name]
        for name, key, help_text in (
            ("tessera:num_requests_running", "engine_requests_running", "Requests in the engines' running batches"),
            ("tessera:num_requests_waiting", "engine_requests_waiting", "Requests waiting for an engine step"),
        ):
            family = GaugeMetricFamily(name, help_text, labels=["model_name"])
            family.add_metric(labels, sum(g.get(key, 0.0) for g in engines))
            yield family
        used = sum(g.get("kv_cache_used_blocks", 0.0) for g in engines)
        capacity = sum(g.get("kv_cache_capacity_blocks", 0.0) for g in engines)
        usage = GaugeMetricFamily("tessera:kv_cache_usage_perc", "Fraction of the engines' KV pages in use (0 to 1)", labels=["model_name"])
        usage.add_metric(labels, used / capacity if capacity else 0.0)
        yield usage
        queue = HistogramMetricFamily(
            "tessera:request_queue_time_seconds", "Arrival at a prefill engine to its first step", labels=["model_name"]
        )
        value = name_to_role_histogram.get("queue_seconds", {}).get("prefill")
        if value is not None:
            queue.add_metric(labels, value.buckets(), sum_value=value.sum)
        yield queue
