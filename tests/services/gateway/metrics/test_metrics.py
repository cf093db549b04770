"""The gateway's /metrics text: its own counters and histograms, and the cluster's metrics summed
per name (histograms per role), as prometheus_client's own parser reads them."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from services.gateway.metrics.metrics import GatewayMetrics
from shared.node_metrics import Histogram, Snapshot


def queue_histogram(*seconds: float) -> Histogram:
    histogram = Histogram("queue_seconds", "A request's wait", (0.1, 1.0))
    for value in seconds:
        histogram.observe(value)
    return histogram


def parse(text: bytes) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text.decode())}


def test_requests_latencies_and_role_counters_parse_as_prometheus_text():
    metrics = GatewayMetrics(
        lambda: {
            "encoder@a:1": Snapshot({"encoder_items_encoded_total": 2.0}),
            "prefill@b:2": Snapshot({"prefix_cached_tokens_total": 16.0, "encoder_items_encoded_total": 1.0}),
            "decode@c:3": Snapshot(gauges={"decode_kv_blocks_free": 40.0}),
        },
        num_in_flight=lambda: 3.0,
    )
    for status in (200, 200, 503):
        metrics.record_request(status)
    metrics.record_ttft(0.07)
    metrics.record_ttft(3.0)
    metrics.record_tokens(0.03, 3)  # three tokens in one event: three 10 ms gaps
    metrics.record_e2e(1.5)
    metrics.record_route(0.003)
    families = parse(metrics.render())

    assert {s.labels["status"]: s.value for s in families["tessera_requests"].samples if s.name.endswith("_total")} == {
        "200": 2.0,
        "503": 1.0,
    }
    ttft = {s.labels.get("le"): s.value for s in families["tessera_ttft_seconds"].samples if s.name.endswith("_bucket")}
    assert ttft["0.1"] == 1.0 and ttft["+Inf"] == 2.0
    itl = {s.name: s.value for s in families["tessera_inter_token_latency_seconds"].samples}
    assert itl["tessera_inter_token_latency_seconds_count"] == 3.0
    assert families["tessera_e2e_latency_seconds"].type == "histogram"
    assert {s.name: s.value for s in families["tessera_route_decision_seconds"].samples}["tessera_route_decision_seconds_count"] == 1.0
    assert families["tessera_requests_in_flight"].samples[0].value == 3.0

    summed = families["tessera_encoder_items_encoded"]
    assert summed.type == "counter" and summed.samples[0].value == 3.0  # summed across roles
    assert families["tessera_decode_kv_blocks_free"].type == "gauge"
    up = {(s.labels["role"], s.labels["address"]) for s in families["tessera_node_up"].samples}
    assert up == {("encoder", "a:1"), ("prefill", "b:2"), ("decode", "c:3")}


def test_series_names_keep_their_total_suffix_in_the_text():
    """Tests and benchmarks read these exact series names."""
    text = GatewayMetrics(lambda: {"gateway@self": Snapshot({"gateway_migrations_total": 2.0})}).render().decode()
    assert "tessera_gateway_migrations_total 2.0" in text.splitlines()


def test_node_histograms_are_summed_per_role_bucket_by_bucket():
    first, second, encoder = queue_histogram(0.05, 2.0), queue_histogram(0.5), queue_histogram(0.01)
    metrics = GatewayMetrics(
        lambda: {
            "prefill@a:1": Snapshot({"prefill_tokens_computed_total": 5.0}, histograms={"queue_seconds": first.value}),
            "prefill@a:2": Snapshot(histograms={"queue_seconds": second.value}),
            "encoder@b:1": Snapshot(histograms={"queue_seconds": encoder.value}),
        }
    )
    family = parse(metrics.render())["tessera_queue_seconds"]
    assert family.type == "histogram"
    samples = {(s.name, s.labels["role"], s.labels.get("le")): s.value for s in family.samples}
    assert samples[("tessera_queue_seconds_bucket", "prefill", "0.1")] == 1.0
    assert samples[("tessera_queue_seconds_bucket", "prefill", "1.0")] == 2.0
    assert samples[("tessera_queue_seconds_bucket", "prefill", "+Inf")] == 3.0
    assert samples[("tessera_queue_seconds_count", "prefill", None)] == 3.0
    assert samples[("tessera_queue_seconds_sum", "prefill", None)] == 2.55
    assert samples[("tessera_queue_seconds_count", "encoder", None)] == 1.0
    assert "tessera_queue_seconds_sum" not in parse(metrics.render())  # not also a flat series


def counter_values(metrics: GatewayMetrics) -> dict[str, float]:
    """Every counter and histogram sample of the text, by name and labels."""
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        if family.type in ("counter", "histogram"):
            for sample in family.samples:
                out[sample.name + str(sorted(sample.labels.items()))] = sample.value
    return out


def test_no_cluster_counter_decreases_when_a_node_leaves_or_restarts():
    queue = {"queue_seconds": queue_histogram(0.05).value}
    nodes = {
        "prefill@a:1": Snapshot({"prefill_tokens_computed_total": 100.0}, {"engine_requests_running": 2.0}, queue),
        "prefill@b:2": Snapshot({"prefill_tokens_computed_total": 50.0}, {"engine_requests_running": 1.0}, queue),
    }
    metrics = GatewayMetrics(lambda: nodes, model_name="m")
    before = counter_values(metrics)
    assert before["tessera_prefill_tokens_computed_total[]"] == 150.0
    del nodes["prefill@b:2"]  # scale-in: b leaves
    after_leave = counter_values(metrics)
    nodes["prefill@a:1"] = Snapshot({"prefill_tokens_computed_total": 3.0}, {"engine_requests_running": 2.0}, queue)  # a restarted
    after_restart = counter_values(metrics)
    for reading in (after_leave, after_restart):
        assert all(reading.get(name, 0.0) >= value for name, value in before.items()), reading
    assert after_restart["tessera_prefill_tokens_computed_total[]"] == 153.0
    families = parse(metrics.render())
    assert {s.labels["address"] for s in families["tessera_node_up"].samples} == {"a:1"}
    assert families["tessera_engine_requests_running"].samples[0].value == 2.0  # a gauge: the live node's only


# The vLLM names (with "tessera:" for "vllm:") that dashboards, KEDA and the inference gateway read;
# the README's mapping table lists the same.
VLLM_NAMES = {
    "tessera:num_requests_running": "gauge",
    "tessera:num_requests_waiting": "gauge",
    "tessera:kv_cache_usage_perc": "gauge",
    "tessera:prompt_tokens": "counter",
    "tessera:generation_tokens": "counter",
    "tessera:request_success": "counter",
    "tessera:time_to_first_token_seconds": "histogram",
    "tessera:inter_token_latency_seconds": "histogram",
    "tessera:e2e_request_latency_seconds": "histogram",
    "tessera:request_queue_time_seconds": "histogram",
}


def test_vllm_named_families_carry_the_model_name_and_process_metrics_are_served():
    nodes = {
        "prefill@a:1": Snapshot(
            gauges={
                "engine_requests_running": 1.0,
                "engine_requests_waiting": 3.0,
                "kv_cache_used_blocks": 10.0,
                "kv_cache_capacity_blocks": 100.0,
            },
            histograms={"queue_seconds": queue_histogram(0.5).value},
        ),
        "decode@c:3": Snapshot(
            gauges={
                "engine_requests_running": 4.0,
                "engine_requests_waiting": 0.0,
                "kv_cache_used_blocks": 30.0,
                "kv_cache_capacity_blocks": 100.0,
            }
        ),
        "encoder@e:5": Snapshot(gauges={"engine_requests_running": 99.0}),  # not an engine: not counted
    }
    metrics = GatewayMetrics(lambda: nodes, model_name="tiny")
    metrics.record_ttft(0.2)
    metrics.record_tokens(0.02, 2)
    metrics.record_e2e(1.0)
    metrics.record_finished(prompt_tokens=30, generation_tokens=8, finish_reasons=["stop", "length"])
    families = parse(metrics.render())
    for name, kind in VLLM_NAMES.items():
        assert families[name].type == kind, name
        assert all(s.labels.get("model_name") == "tiny" for s in families[name].samples), name

    def value(name, **labels):
        return next(
            s.value
            for s in families[name].samples
            if all(s.labels.get(k) == v for k, v in labels.items()) and not s.name.endswith("_created")
        )

    assert value("tessera:num_requests_running") == 5.0 and value("tessera:num_requests_waiting") == 3.0
    assert value("tessera:kv_cache_usage_perc") == 0.2
    assert value("tessera:prompt_tokens") == 30.0 and value("tessera:generation_tokens") == 8.0
    assert value("tessera:request_success", finished_reason="length") == 1.0
    queue_count = next(s.value for s in families["tessera:request_queue_time_seconds"].samples if s.name.endswith("_count"))
    assert queue_count == 1.0
    assert "process_cpu_seconds" in families and "python_gc_objects_collected" in families


def test_with_vllm_metric_names_each_vllm_family_is_served_under_vllm_too():
    nodes = {"prefill@p:1": Snapshot(gauges={"engine_requests_waiting": 3.0, "kv_cache_used_blocks": 1.0, "kv_cache_capacity_blocks": 4.0})}
    metrics = GatewayMetrics(lambda: nodes, model_name="tiny", vllm_names=True)
    metrics.record_ttft(0.2)
    metrics.record_finished(prompt_tokens=30, generation_tokens=8, finish_reasons=["stop"])
    families = parse(metrics.render())
    for name, kind in VLLM_NAMES.items():
        alias = families["vllm:" + name.removeprefix("tessera:")]
        assert alias.type == kind and families[name].type == kind, name
        assert [(s.name.replace("vllm:", "tessera:"), s.labels, s.value) for s in alias.samples if not s.name.endswith("_created")] == [
            (s.name, s.labels, s.value) for s in families[name].samples if not s.name.endswith("_created")
        ], name
    assert families["vllm:num_requests_waiting"].samples[0].value == 3.0
    assert not any(name.startswith("vllm:") for name in parse(GatewayMetrics(lambda: nodes).render()))  # off by default
