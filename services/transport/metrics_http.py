"""Each role's own Prometheus endpoint (``--metrics-port``), so a role running alone in a
container or pod can be scraped, and an autoscaler can read its queue.

``tessera_node_queue_depth`` is the work queued or running on the node (requests for prefill and
decode, encode calls for encoders, preprocess calls): what its latency grows with, and the metric
the HorizontalPodAutoscalers in deploy/kubernetes scale on. The node's Stats counters follow as
``tessera_<name>``, and its histograms (shared/flat_histogram.py) as Prometheus histograms, such
as ``tessera_queue_seconds``.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from shared.flat_histogram import histogram_samples


class NodeCollector(Collector):
    def __init__(self, role: str, queue_depth: Callable[[], float], counters: Callable[[], dict[str, float]]) -> None:
        self.role = role
        self.queue_depth = queue_depth
        self.counters = counters

    def collect(self):
        depth = GaugeMetricFamily("tessera_node_queue_depth", "work queued or running on this node", labels=["role"])
        depth.add_metric([self.role], self.queue_depth())
        yield depth
        samples, rest = histogram_samples(self.counters())
        for name, sample in sorted(samples.items()):
            histogram = HistogramMetricFamily(f"tessera_{name}", f"{self.role} node histogram {name}", labels=["role"])
            histogram.add_metric([self.role], sample.sorted_buckets(), sum_value=sample.sum)
            yield histogram
        for name, value in sorted(rest.items()):
            kind = CounterMetricFamily if name.endswith("_total") else GaugeMetricFamily
            family = kind(f"tessera_{name}", f"{self.role} node statistic {name}", labels=["role"])
            family.add_metric([self.role], value)
            yield family


def start_metrics_server(host: str, port: int, collector: NodeCollector) -> None:
    registry = CollectorRegistry()
    registry.register(collector)
    for process_collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(process_collector)
    start_http_server(port, addr=host, registry=registry)
