"""A node's own Prometheus endpoint: queue depth, and its metrics under their declared kinds and
help, over real HTTP."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from services.stack.node_process import free_port
from services.transport.metrics_http import NodeCollector, start_metrics_server
from shared.node_metrics import Counter, Gauge, Histogram, counter, gauge, histogram, snapshot


@dataclass(slots=True)
class ProbeMetrics:
    num_items_encoded: Counter = counter("encoder_items_encoded_total", "Images run through the vision tower")
    cache_tokens: Gauge = gauge("encoder_cache_tokens", "Tokens cached")
    queue_time: Histogram = histogram("queue_seconds", "A call's wait for its batch", (0.1, 1.0))


def test_a_node_serves_its_queue_depth_and_typed_metrics():
    metrics = ProbeMetrics()
    metrics.num_items_encoded.inc(7)
    metrics.cache_tokens.set(128)
    metrics.queue_time.observe(0.05)
    metrics.queue_time.observe(3.0)
    port = free_port()
    start_metrics_server("127.0.0.1", port, NodeCollector("encoder", lambda: 3.0, lambda: snapshot(metrics)))
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["tessera_node_queue_depth"].samples[0].value == 3.0
    assert families["tessera_node_queue_depth"].samples[0].labels == {"role": "encoder"}
    encoded = families["tessera_encoder_items_encoded"]
    assert (
        encoded.type == "counter" and encoded.samples[0].name == "tessera_encoder_items_encoded_total" and encoded.samples[0].value == 7.0
    )
    assert encoded.documentation == "Images run through the vision tower"
    assert families["tessera_encoder_cache_tokens"].type == "gauge"
    queue = families["tessera_queue_seconds"]
    assert queue.type == "histogram"
    samples = {(s.name, s.labels.get("le")): s.value for s in queue.samples}
    assert samples[("tessera_queue_seconds_bucket", "0.1")] == 1.0 and samples[("tessera_queue_seconds_bucket", "+Inf")] == 2.0
    assert samples[("tessera_queue_seconds_count", None)] == 2.0 and samples[("tessera_queue_seconds_sum", None)] == 3.05
