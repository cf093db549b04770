"""A node's own Prometheus endpoint: queue depth, its counters typed as counters, over real HTTP."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from services.stack.launcher import free_port
from services.transport.metrics_http import NodeCollector, start_metrics_server


def test_a_node_serves_its_queue_depth_and_typed_counters():
    port = free_port()
    collector = NodeCollector("encoder", lambda: 3.0, lambda: {"encoder_items_encoded_total": 7.0, "encoder_cache_tokens": 128.0})
    start_metrics_server("127.0.0.1", port, collector)
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["tessera_node_queue_depth"].samples[0].value == 3.0
    assert families["tessera_node_queue_depth"].samples[0].labels == {"role": "encoder"}
    encoded = families["tessera_encoder_items_encoded"]
    assert (
        encoded.type == "counter" and encoded.samples[0].name == "tessera_encoder_items_encoded_total" and encoded.samples[0].value == 7.0
    )
    assert families["tessera_encoder_cache_tokens"].type == "gauge"
