from __future__ import annotations

from services.gateway.metrics import GatewayMetrics


def test_prometheus_text_has_counters_histogram_and_role_metrics():
    metrics = GatewayMetrics()
    metrics.record_request(200)
    metrics.record_request(200)
    metrics.record_request(503)
    metrics.record_ttft(0.07)
    metrics.record_ttft(3.0)
    text = metrics.render(
        {
            "encoder@a:1": {"encoder_items_encoded_total": 2.0},
            "prefill@b:2": {"prefix_cached_tokens_total": 16.0, "encoder_items_encoded_total": 1.0},
        }
    )
    lines = set(text.splitlines())
    assert 'tessera_requests_total{status="200"} 2' in lines and 'tessera_requests_total{status="503"} 1' in lines
    assert 'tessera_ttft_seconds_bucket{le="0.1"} 1' in lines and 'tessera_ttft_seconds_bucket{le="+Inf"} 2' in lines
    assert "tessera_ttft_seconds_count 2" in lines
    assert "tessera_encoder_items_encoded_total 3" in lines  # summed across roles
    assert "# TYPE tessera_prefix_cached_tokens_total counter" in lines
    assert 'tessera_node_up{role="encoder",address="a:1"} 1' in lines
