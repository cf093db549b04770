"""Each role's own Prometheus endpoint (``--metrics-port``), so a role running alone in a
container or pod can be scraped, and an autoscaler can read its queue.

``tessera_node_queue_depth`` is the work queued or running on the node (requests for prefill and
decode, encode calls for encoders, preprocess calls): what its latency grows with, and the metric
the HorizontalPodAutoscalers in deploy/kubernetes scale on. The node's metrics follow, rendered
from the same typed snapshot its Stats reply carries (shared/node_metrics.py): each as
``tessera_<name>`` with its declared help and kind, histograms such as ``tessera_queue_seconds``.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from shared.node_metrics import Snapshot


class NodeCollector(Collector):
    def __init__(self, role: str, queue_depth: Callable[[], float], snapshot: Callable[[], Snapshot]) -> None:
        self.role = role
        self.queue_depth = queue_depth
        self.snapshot = snapshot

    def collect(self):
        depth = GaugeMetricFamily("tessera_node_queue_depth", "work queued or running on this node", labels=["role"])
        depth.add_metric([self.role], self.queue_depth())
        yield depth
        stats = self.snapshot()
        for name, value in sorted(stats.histograms.items()):
            histogram = HistogramMetricFamily(f"tessera_{name}", stats.help.get(name, name), labels=["role"])
            histogram.add_metric([self.role], value.buckets(), sum_value=value.sum)
            yield histogram
        for kind, values in ((CounterMetricFamily, stats.counters), (GaugeMetricFamily, stats.gauges)):
            for name, value in sorted(values.items()):
                family = kind(f"tessera_{name}", stats.help.get(name, name), labels=["role"])
                family.add_metric([self.role], value)
                yield family


def start_metrics_server(host: str, port: int, collector: NodeCollector) -> None:
    registry = CollectorRegistry()
    registry.register(collector)
    for process_collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(process_collector)
    start_http_server(port, addr=host, registry=registry)
