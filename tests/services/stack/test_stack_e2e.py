"""End to end: the real multi-process stack driven by the official openai client, checked
against the reference oracle."""

from __future__ import annotations

import json
import os
import signal
import time

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from openai import APIStatusError, OpenAI

from services.engine.config import EngineConfig
from tests.factories import chat_case, encode_image, make_image

GREEDY = {"temperature": 0, "max_tokens": 12, "extra_body": {"ignore_eos": True}}


def _client(stack) -> OpenAI:
    return OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=120)


def _oracle_text(oracle, case, max_tokens=12):
    inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images)
    tokens = oracle.generate(inputs, max_tokens).token_ids
    return oracle.tokenizer.decode(tokens, skip_special_tokens=True), len(inputs.token_ids)


def _png(w, h, seed):
    return encode_image(make_image(w, h, seed=seed))


def test_each_role_is_its_own_process_and_answers_health_checks(stack):
    roles = stack.state()["roles"]
    assert set(roles) == {"preprocess", "encoder", "prefill", "decode", "gateway"}
    pids = {info["pid"] for info in roles.values()}
    assert len(pids) == 5 and os.getpid() not in pids and stack.process.pid not in pids
    for pid in pids:
        os.kill(pid, 0)  # alive
    for role, info in roles.items():
        with grpc.insecure_channel(info["grpc_address"]) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, role
    health = httpx.get(stack.base_url.removesuffix("/v1") + "/health", timeout=10).json()
    assert health["status"] == "ok"
    # The gateway lists the members it discovered in the index: each node's advertised address.
    assert {n["role"]: n["address"] for n in health["nodes"]} == {
        r: roles[r]["grpc_address"] for r in ("preprocess", "encoder", "prefill", "decode")
    }


def test_non_streaming_image_request_equals_the_oracle(stack, oracle):
    case = chat_case(_png(112, 84, 1), "What is in this image?")
    reply = _client(stack).chat.completions.create(model="tiny", messages=case.body["messages"], **GREEDY)
    text, prompt_len = _oracle_text(oracle, case)
    assert reply.choices[0].message.content == text
    assert reply.usage.prompt_tokens == prompt_len and reply.usage.completion_tokens == 12
    assert reply.choices[0].finish_reason == "length"


def test_streaming_with_usage_equals_the_oracle(stack, oracle):
    case = chat_case("Describe", _png(84, 84, 2), "in one line.")
    chunks = list(
        _client(stack).chat.completions.create(
            model="tiny", messages=case.body["messages"], stream=True, stream_options={"include_usage": True}, **GREEDY
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    expected, prompt_len = _oracle_text(oracle, case)
    assert text == expected
    usage = [c.usage for c in chunks if c.usage]
    assert len(usage) == 1 and usage[0].prompt_tokens == prompt_len and usage[0].completion_tokens == 12
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]


def test_multi_image_multi_turn_equals_the_oracle(stack, oracle):
    first = chat_case(_png(56, 84, 3), "first", _png(84, 56, 4), "second")
    messages = first.body["messages"] + [
        {"role": "assistant", "content": "Two pictures."},
        {"role": "user", "content": [{"type": "text", "text": "Which is brighter?"}]},
    ]
    first.oracle_messages += [
        {"role": "assistant", "content": "Two pictures."},
        {"role": "user", "content": [{"type": "text", "text": "Which is brighter?"}]},
    ]
    reply = _client(stack).chat.completions.create(model="tiny", messages=messages, **GREEDY)
    text, prompt_len = _oracle_text(oracle, first)
    assert reply.choices[0].message.content == text and reply.usage.prompt_tokens == prompt_len


def test_shared_image_encodes_once_and_sends_pixels_once(stack, oracle):
    client = _client(stack)
    image = _png(140, 112, 5)
    case_a, case_b = chat_case(image, "What colour?"), chat_case(image, "How many shapes?")
    before = stack.metrics()
    a = client.chat.completions.create(model="tiny", messages=case_a.body["messages"], **GREEDY)
    middle = stack.metrics()
    b = client.chat.completions.create(model="tiny", messages=case_b.body["messages"], **GREEDY)
    after = stack.metrics()
    assert after["tessera_encoder_items_encoded_total"] - before["tessera_encoder_items_encoded_total"] == 1
    assert middle["tessera_pixel_bytes_sent_total"] - before["tessera_pixel_bytes_sent_total"] > 0
    # The second request's pixels never travel: the index (or the sender-cache mirror) knows
    # the encoder holds the image.
    assert after["tessera_pixel_bytes_sent_total"] == middle["tessera_pixel_bytes_sent_total"]
    assert a.choices[0].message.content == _oracle_text(oracle, case_a)[0]
    expected_b, prompt_len = _oracle_text(oracle, case_b)
    assert b.choices[0].message.content == expected_b
    repeat = client.chat.completions.create(model="tiny", messages=case_b.body["messages"], **GREEDY)
    assert repeat.choices[0].message.content == expected_b
    # Every full block of the prompt but the one holding its last token (which is always computed).
    block_size = EngineConfig().block_size
    assert repeat.usage.prompt_tokens_details.cached_tokens == (prompt_len - 1) // block_size * block_size


def test_concurrent_requests_for_one_new_image_share_a_single_encode(stack, oracle):
    """Both arrive before the image is cached anywhere; the prefill node fetches it once and
    both requests use it (a second fetch used to wait out its timeout and fail)."""
    from concurrent.futures import ThreadPoolExecutor

    client = _client(stack)
    image = _png(336, 336, 77)
    cases = [chat_case(image, "What colour?"), chat_case(image, "How many shapes?")]
    before = stack.metrics()
    with ThreadPoolExecutor(2) as pool:  # the bug this guards against failed one of them with a 503
        replies = list(pool.map(lambda c: client.chat.completions.create(model="tiny", messages=c.body["messages"], **GREEDY), cases))
    for case, reply in zip(cases, replies):
        assert reply.choices[0].message.content == _oracle_text(oracle, case)[0]
    assert stack.metrics()["tessera_encoder_items_encoded_total"] - before["tessera_encoder_items_encoded_total"] == 1


def test_bad_input_gets_a_clear_4xx_and_the_service_keeps_running(stack):
    client = _client(stack)
    bad = [
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}]}], 400, "base64"),
        ([{"role": "user", "content": [{"type": "audio", "audio": "x"}]}], 400, "unsupported content part type"),
        ([{"role": "wizard", "content": "hi"}], 400, "role"),
    ]
    for messages, status, text in bad:
        with pytest.raises(APIStatusError) as info:
            client.chat.completions.create(model="tiny", messages=messages, max_tokens=4)
        assert info.value.status_code == status and text in info.value.message
    with pytest.raises(APIStatusError) as info:
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 404
    raw = httpx.post(stack.base_url + "/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"}, timeout=30)
    assert raw.status_code == 400 and "not valid JSON" in raw.json()["error"]["message"]
    ok = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "still alive?"}], **GREEDY)
    assert ok.usage.completion_tokens == 12


def test_cancelled_stream_frees_its_kv_pages(stack):
    free_before = stack.metrics()["tessera_decode_kv_blocks_free"]
    stream = _client(stack).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Tell me a very long story."}],
        stream=True,
        temperature=0,
        max_tokens=2000,
        extra_body={"ignore_eos": True},
    )
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and stack.metrics()["tessera_decode_kv_blocks_free"] != free_before:
        time.sleep(0.5)
    assert stack.metrics()["tessera_decode_kv_blocks_free"] == free_before


def test_public_grpc_generate_streams_tokens(stack, oracle):
    from protos.gen import pb, rpc

    case = chat_case(_png(70, 70, 6), "Name it.")
    body = {"model": "tiny", "messages": case.body["messages"], "temperature": 0, "max_tokens": 12, "ignore_eos": True}
    with grpc.insecure_channel(stack.generate_address) as channel:
        chunks = list(rpc.GenerateStub(channel).Generate(pb.GenerateRequest(request_json=json.dumps(body)), timeout=120))
    text, prompt_len = _oracle_text(oracle, case)
    assert "".join(c.text_delta for c in chunks) == text
    assert chunks[-1].finished and chunks[-1].usage.prompt_tokens == prompt_len


def test_killed_role_fails_fast_with_503_and_restart_restores_service(stack):
    client = _client(stack)
    state = stack.state()["roles"]["decode"]
    os.kill(state["pid"], signal.SIGKILL)
    time.sleep(0.3)
    started = time.monotonic()
    with pytest.raises(APIStatusError) as info:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "anyone there?"}], max_tokens=4)
    assert info.value.status_code == 503 and "decode" in info.value.message
    assert time.monotonic() - started < 10
    deadline = time.monotonic() + 180  # the launcher restarts the role on the same ports
    while time.monotonic() < deadline:
        roles = stack.state()["roles"]
        if roles["decode"]["restarts"] >= 1:
            try:
                reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "back?"}], **GREEDY)
                assert reply.usage.completion_tokens == 12
                return
            except APIStatusError:
                pass
        time.sleep(1)
    pytest.fail("service did not recover after the decode role was restarted")


def test_one_trace_spans_every_role(stack):
    case = chat_case(_png(98, 98, 7), "Trace me.")
    _client(stack).chat.completions.create(model="tiny", messages=case.body["messages"], **GREEDY)
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
    client = _client(stack)
    case = chat_case(_png(90, 90, 8), "Where did I go?")

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


def test_nodes_publish_their_caches_to_the_embedded_valkey_index(stack):
    from services.engine.config import EngineConfig
    from services.preprocess import Preprocessor
    from shared.hashing import MmSpan, block_hashes
    from shared.index.backend import create_index
    from shared.models.registry import resolve_model

    case = chat_case(_png(112, 112, 8), "Index me.")
    _client(stack).chat.completions.create(model="tiny", messages=case.body["messages"], **GREEDY)
    prep = Preprocessor(resolve_model("tiny")).preprocess(case.body)
    item = prep.mm_items[0]
    hashes = block_hashes(prep.prompt_token_ids, EngineConfig().block_size, [MmSpan(item.mm_hash, item.placeholder)])
    index = create_index(stack.state()["valkey"]["url"], namespace="tessera-tiny")
    deadline = time.monotonic() + 10
    while True:
        result = index.lookup([item.mm_hash], hashes)
        holders = {nid.split("@")[0] for nid, n in result.node_to_num_prefix_blocks.items() if n == len(hashes)}
        if (result.mm_holders[item.mm_hash] and holders == {"prefill", "decode"}) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert [nid.split("@")[0] for nid in result.mm_holders[item.mm_hash]] == ["encoder"]
    assert result.mm_holders[item.mm_hash][next(iter(result.mm_holders[item.mm_hash]))].num_tokens == item.placeholder.length
    assert holders == {"prefill", "decode"}  # both hold every full prompt block
    assert {state.info.role for state in result.nodes.values()} == {"preprocess", "encoder", "prefill", "decode"}


def test_text_completion_of_a_raw_prompt_with_an_image_equals_the_oracle(stack, oracle):
    """/v1/completions: no chat template; the image goes in multi_modal_data and its placeholder
    is in the prompt text."""
    case = chat_case(_png(96, 72, 5), "What shape is this?")
    prompt = oracle.chat_text(case.oracle_messages)
    image_url = case.body["messages"][0]["content"][0]["image_url"]["url"]
    client = _client(stack)
    reply = client.completions.create(
        model="tiny",
        prompt=prompt,
        extra_body={"multi_modal_data": {"image": image_url}, **GREEDY["extra_body"]},
        temperature=0,
        max_tokens=12,
    )
    expected, prompt_len = _oracle_text(oracle, case)
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
    case = chat_case(_png(100, 60, 6), "Name three colours.")
    expected, prompt_len = _oracle_text(oracle, case)
    before = stack.metrics()["tessera_prefill_tokens_computed_total"]
    reply = _client(stack).chat.completions.create(model="tiny", messages=case.body["messages"], n=3, **GREEDY)
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

    case = chat_case(_png(64, 64, 9), "Guess.")
    inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images)
    reference = oracle.generate(inputs, 6)
    expected = [torch.log_softmax(step, dim=-1) for step in reference.step_logits]
    client = _client(stack)
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
        return {s.name: s.value for f in families if f.type == "histogram" for s in f.samples if s.name.endswith("_count")}

    before = histogram_counts()
    list(_client(stack).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Count."}], stream=True, **GREEDY))
    after = histogram_counts()
    assert after["tessera_ttft_seconds_count"] == before["tessera_ttft_seconds_count"] + 1
    assert after["tessera_e2e_latency_seconds_count"] == before["tessera_e2e_latency_seconds_count"] + 1
    assert after["tessera_inter_token_latency_seconds_count"] - before["tessera_inter_token_latency_seconds_count"] == 11  # 12 tokens
    assert after["tessera_route_decision_seconds_count"] == before["tessera_route_decision_seconds_count"] + 1


def test_tessera_bench_runs_every_workload_against_the_stack(stack, tmp_path):
    """The smoke run of `tessera bench`: each named workload, tiny sizes, against this stack."""
    from services.bench import report
    from services.cli.main import main

    argv = ["bench", "--workload", "all", "--requests", "4", "--concurrency", "2", "--max-tokens", "4", "--image-size", "64x64"]
    assert main([*argv, "--base-url", stack.base_url, "--out", str(tmp_path), "--no-progress", "--label", "smoke"]) == 0
    runs = {run.workload: run for run in (report.load(path) for path in tmp_path.glob("*.json"))}
    assert set(runs) == {"shared_images", "multi_turn", "long_prompts", "cold_images"}
    for name, run in runs.items():
        summary = run.summary()
        assert summary["requests_ok"] == 4 and summary["requests_failed"] == 0, name
        assert all(r.num_tokens == 4 for r in run.records), name
    assert 0 < runs["shared_images"].cache_hit_rates["processor"] <= 1
    assert len(list(tmp_path.glob("*.png"))) == 4
