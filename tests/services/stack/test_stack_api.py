"""The OpenAI API surface and the observability of the default stack, end to end with the
official openai client: text completions with images, n choices sharing one prefill, logprobs
equal to transformers', OTLP traces with the routing decision, /metrics and the Grafana
dashboard's series, and a `tessera bench` smoke run of every workload. Shares the session's stack
with test_stack_e2e."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from services.engine.config import EngineConfig
from tests.factories import chat_case
from tests.services.stack.e2e_helpers import GREEDY, client_for, oracle_text, png


def test_one_trace_spans_every_role(stack):
    case = chat_case(png(98, 98, 7), "Trace me.")
    client_for(stack).chat.completions.create(model="tiny", messages=case.body["messages"], **GREEDY)
    time.sleep(1.0)
    spans = [json.loads(line) for path in stack.trace_dir.glob("*.jsonl") for line in path.read_text().splitlines()]
    roots = [s for s in spans if s["name"] == "gateway.generate"]
    assert roots
    trace_id = roots[-1]["trace_id"]
    services = {s["service"] for s in spans if s["trace_id"] == trace_id}
    assert services == {"tessera-gateway", "tessera-preprocess", "tessera-encoder", "tessera-prefill", "tessera-decode"}
    names = {s["name"] for s in spans if s["trace_id"] == trace_id}
    assert {
        "/tessera.v1.Preprocess/Preprocess",
        "/tessera.v1.Encode/Encode",
        "/tessera.v1.Prefill/Prefill",
        "/tessera.v1.Decode/Decode",
    } <= names


def test_traces_reach_an_otlp_collector_with_the_routing_decision(stack, otlp_receiver):
    """The stack runs with the standard OTEL_EXPORTER_OTLP_ENDPOINT pointing at a real OTLP/gRPC
    receiver; the route span says where the request went and what each node already held."""
    client = client_for(stack)
    case = chat_case(png(90, 90, 8), "Where did I go?")

    def cached_routes(spans):
        return [s for s in spans if s.name == "gateway.route" and s.attributes.get("tessera.route.images_on_encoder") == 1]

    # Repeats: once the encoder has published the image to the index, a route finds it cached.
    for _ in range(10):
        client.chat.completions.create(model="tiny", messages=case.body["messages"], **GREEDY)
        try:
            route = cached_routes(otlp_receiver.wait_for(cached_routes, timeout_s=3))[-1]
            break
        except AssertionError:
            continue
    else:
        pytest.fail("no route span found the image on its encoder")
    roles = stack.state()["roles"]
    assert route.service == "tessera-gateway"
    assert route.attributes["tessera.route.encoder"] == roles["encoder"]["grpc_address"]
    assert route.attributes["tessera.route.prefill"] == roles["prefill"]["grpc_address"]
    assert route.attributes["tessera.route.prefill_prefix_tokens"] > 0
    assert route.attributes["tessera.route.reason"].startswith("cache_aware: encoder holds 1/1 images; prefill holds ")
    expected = {"tessera-gateway", "tessera-preprocess", "tessera-prefill", "tessera-decode"}
    otlp_receiver.wait_for(lambda spans: expected <= {s.service for s in spans if s.trace_id == route.trace_id})


def test_text_completion_of_a_raw_prompt_with_an_image_equals_the_oracle(stack, oracle):
    """/v1/completions: no chat template; the image goes in multi_modal_data and its placeholder
    is in the prompt text."""
    case = chat_case(png(96, 72, 5), "What shape is this?")
    prompt = oracle.chat_text(case.oracle_messages)
    image_url = case.body["messages"][0]["content"][0]["image_url"]["url"]
    client = client_for(stack)
    reply = client.completions.create(
        model="tiny",
        prompt=prompt,
        extra_body={"multi_modal_data": {"image": image_url}, **GREEDY["extra_body"]},
        temperature=0,
        max_tokens=12,
    )
    expected, prompt_len = oracle_text(oracle, case)
    assert reply.choices[0].text == expected and reply.usage.prompt_tokens == prompt_len
    chunks = list(
        client.completions.create(
            model="tiny",
            prompt=prompt,
            stream=True,
            extra_body={"multi_modal_data": {"image": image_url}, "ignore_eos": True},
            temperature=0,
            max_tokens=12,
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected


def test_n_choices_equal_the_oracle_and_share_one_prefill_of_the_prompt(stack, oracle):
    case = chat_case(png(100, 60, 6), "Name three colours.")
    expected, prompt_len = oracle_text(oracle, case)
    before = stack.metrics()["tessera_prefill_tokens_computed_total"]
    reply = client_for(stack).chat.completions.create(model="tiny", messages=case.body["messages"], n=3, **GREEDY)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert [c.message.content for c in reply.choices] == [expected] * 3
    assert reply.usage.prompt_tokens == prompt_len and reply.usage.completion_tokens == 36
    # Choice 0 prefills the whole prompt; choices 1 and 2 start after it and hit its full blocks.
    block_size = EngineConfig().block_size
    uncached_tail = prompt_len - (prompt_len - 1) // block_size * block_size
    computed = stack.metrics()["tessera_prefill_tokens_computed_total"] - before
    assert computed == prompt_len + 2 * uncached_tail


def test_every_series_the_grafana_dashboard_plots_is_served(stack, repo_root):
    """deploy/grafana/tessera-dashboard.json queries only series the stack exposes: the gateway's
    /metrics, and the queue depth each node serves on its own metrics port."""
    import re

    dashboard = (repo_root / "deploy" / "grafana" / "tessera-dashboard.json").read_text()
    plotted = set(re.findall(r"tessera_[a-z0-9_]+", dashboard))
    served = {re.sub(r"\{.*", "", name) for name in stack.metrics()}
    per_node = {"tessera_node_queue_depth"}
    assert plotted - per_node <= served, f"plotted but not served: {sorted(plotted - per_node - served)}"


def test_logprobs_equal_the_oracles_on_both_endpoints(stack, oracle):
    """The first token's logprobs come from the prefill node, the rest from the decode node; all
    are the model's log-softmax, as transformers computes it."""
    import torch

    case = chat_case(png(64, 64, 9), "Guess.")
    inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images)
    reference = oracle.generate(inputs, 6)
    expected = [torch.log_softmax(step, dim=-1) for step in reference.step_logits]
    client = client_for(stack)
    reply = client.chat.completions.create(
        model="tiny",
        messages=case.body["messages"],
        logprobs=True,
        top_logprobs=2,
        temperature=0,
        max_tokens=6,
        extra_body={"ignore_eos": True},
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == 6
    for step, (token, logprobs) in enumerate(zip(content, expected)):
        token_id = reference.token_ids[step]
        assert abs(token.logprob - logprobs[token_id].item()) < 1e-4, step
        assert len(token.top_logprobs) == 2 and abs(token.top_logprobs[0].logprob - logprobs.max().item()) < 1e-4
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=case.body["messages"],
            logprobs=True,
            temperature=0,
            max_tokens=6,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [round(t.logprob, 4) for t in streamed] == [round(t.logprob, 4) for t in content]
    completion = client.completions.create(
        model="tiny",
        prompt=oracle.chat_text(case.oracle_messages),
        logprobs=1,
        temperature=0,
        max_tokens=6,
        extra_body={"multi_modal_data": {"image": case.body["messages"][0]["content"][0]["image_url"]["url"]}, "ignore_eos": True},
    )
    assert [round(v, 4) for v in completion.choices[0].logprobs.token_logprobs] == [round(t.logprob, 4) for t in content]
    assert completion.choices[0].logprobs.text_offset[0] == 0


def test_metrics_parse_with_prometheus_client_and_the_histograms_move(stack):
    from prometheus_client.parser import text_string_to_metric_families

    url = stack.base_url.removesuffix("/v1") + "/metrics"

    def histogram_counts() -> dict[str, float]:
        families = text_string_to_metric_families(httpx.get(url, timeout=30).text)
        return {
            s.name + (f"{{{s.labels['role']}}}" if "role" in s.labels else ""): s.value
            for f in families
            if f.type == "histogram"
            for s in f.samples
            if s.name.endswith("_count")
        }

    before = histogram_counts()
    list(client_for(stack).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Count."}], stream=True, **GREEDY))
    after = histogram_counts()
    assert after["tessera_ttft_seconds_count"] == before["tessera_ttft_seconds_count"] + 1
    assert after["tessera_e2e_latency_seconds_count"] == before["tessera_e2e_latency_seconds_count"] + 1
    assert after["tessera_inter_token_latency_seconds_count"] - before["tessera_inter_token_latency_seconds_count"] == 11  # 12 tokens
    assert after["tessera_route_decision_seconds_count"] == before["tessera_route_decision_seconds_count"] + 1
    # Each role's queue time, one observation per call it ran (a text prompt: no encode).
    for role in ("preprocess", "prefill", "decode"):
        name = f"tessera_queue_seconds_count{{{role}}}"
        assert after[name] == before.get(name, 0.0) + 1, role


def test_tessera_bench_runs_every_workload_against_the_stack(stack, tmp_path):
    """The smoke run of `tessera bench`: each named workload, tiny sizes, against this stack."""
    from services.bench import report
    from services.cli.main import main

    argv = [
        "bench",
        "--workload",
        "all",
        "--requests",
        "4",
        "--concurrency",
        "2",
        "--max-tokens",
        "4",
        "--image-size",
        "64x64",
        "--warmup",
        "1",
    ]
    assert main([*argv, "--base-url", stack.base_url, "--out", str(tmp_path), "--no-progress", "--label", "smoke"]) == 0
    runs = {run.workload: run for run in (report.load(path) for path in tmp_path.glob("*.json"))}
    assert set(runs) == {"shared_images", "multi_turn", "long_prompts", "cold_images", "video_clips"}
    video = runs["video_clips"].summary()
    assert video["tower_runs_per_new_group"] == 1.0 and video["video_decode_s"] > 0 and video["tower_s"] > 0
    for name, run in runs.items():
        summary = run.summary()
        assert summary["requests_ok"] == 4 and summary["requests_failed"] == 0, name
        assert all(r.num_tokens == 4 for r in run.records), name
    assert 0 < runs["shared_images"].cache_hit_rates["processor"] <= 1
    assert len(list(tmp_path.glob("*.png"))) == 5
