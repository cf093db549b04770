"""The gateway's /metrics, with prometheus_client: its own request counter and latency histograms
(TTFT, inter-token latency, end-to-end), plus, gathered at scrape time with the Stats RPC, every
live node's counters summed per name, its histograms (each role's queue time,
``tessera_queue_seconds{role}``) summed per role, and a ``tessera_node_up`` per node. All names start
``tessera_``. Each node also serves its own metrics (services/transport/metrics_http.py) for a
Prometheus that scrapes pods directly; this view is the one-URL summary of the whole cluster."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from shared.flat_histogram import HistogramSample, histogram_samples

TTFT_BUCKETS_S = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS_S = (0.005, 0.01, 0.02, 0.04, 0.06, 0.1, 0.25, 0.5, 1.0, 2.5)
E2E_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
ROUTE_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

# "role@address" -> {counter name: value}, one entry per node that answered Stats.
RoleCounters = dict[str, dict[str, float]]


class GatewayMetrics:
    def __init__(self, role_counters: Callable[[], RoleCounters] = dict, num_in_flight: Callable[[], float] = lambda: 0.0) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
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
        self.registry.register(_ClusterCollector(role_counters))

    def record_request(self, status: int) -> None:
        self.requests.labels(status=str(status)).inc()

    def record_ttft(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def record_tokens(self, seconds: float, num_tokens: int) -> None:
        """``num_tokens`` arrived together ``seconds`` after the previous ones: each is one gap."""
        for _ in range(num_tokens):
            self.itl.observe(seconds / num_tokens)

    def record_e2e(self, seconds: float) -> None:
        self.e2e.observe(seconds)

    def record_route(self, seconds: float) -> None:
        self.route.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _ClusterCollector(Collector):
    def __init__(self, role_counters: Callable[[], RoleCounters]) -> None:
        self.role_counters = role_counters

    def describe(self) -> list[Metric]:
        return []  # dynamic: the names depend on which roles answer

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, float] = {}
        # Histograms (shared/flat_histogram.py) are summed per role, bucket by bucket.
        name_to_role_samples: dict[str, dict[str, HistogramSample]] = {}
        up = GaugeMetricFamily("tessera_node_up", "A node that answered the scrape's Stats call", labels=["role", "address"])
        for node, counters in sorted(self.role_counters().items()):
            role, _, address = node.partition("@")
            samples, rest = histogram_samples(counters)
            for name, value in rest.items():
                merged[name] = merged.get(name, 0.0) + value
            for name, sample in samples.items():
                name_to_role_samples.setdefault(name, {}).setdefault(role, HistogramSample()).add(sample)
            up.add_metric([role, address], 1.0)
        yield up
        for name, role_to_sample in sorted(name_to_role_samples.items()):
            family = HistogramMetricFamily(f"tessera_{name}", "Summed over each role's live nodes", labels=["role"])
            for role, sample in sorted(role_to_sample.items()):
                family.add_metric([role], sample.sorted_buckets(), sum_value=sample.sum)
            yield family
        for name, value in sorted(merged.items()):
            help_text = "Summed over the live nodes"
            family = CounterMetricFamily if name.endswith("_total") else GaugeMetricFamily
            yield family(f"tessera_{name}", help_text, value=value)
