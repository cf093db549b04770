"""docker-compose.yml with every replica on a host of its own: a network namespace with its own
address on a bridge (tests/deploy/netns_hosts.py), as containers on a compose network. Each node
binds 0.0.0.0 and advertises what its host name resolves to, as the file configures it; nothing
about addresses is rewritten (tests/deploy/compose_mapping.plan_replica_on_host). Valkey runs on
its own host under its service name; preprocess, two encoders, two prefill and two decode nodes
and the gateway on one each. On one loopback interface a node that hands peers its bound
address still reaches the right node; here it reaches itself, so these tests fail on that bug.

For each family, image and video
requests through the gateway (the official openai client) equal transformers' greedy output, each
temporal group of a clip is encoded once across the hosts, and the
nodes' counters show embeddings and KV pages crossing hosts (round-robin placement puts the turns
of one conversation on both prefill nodes). For Qwen2-VL's tiny also: a second gateway that has
prefill nodes encode images themselves (pixels pushed to a prefill node's advertised address),
a decode node SIGKILLed under 20 streams, whose streams migrate with none
failing, and a LoRA adapter on the language model and the vision tower loaded at runtime through
a cache-aware gateway onto one encoder, one prefill and one decode host, whose records then list
it: its requests go there (the prefill host asks the encoder host to run it) and equal
transformers with the adapter merged.

Skipped, with the reason, where namespaces cannot be made (not root). Traffic goes only to the
addresses of the namespaces made here; they are removed after.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from services.gateway.frontend.adapter_updates import RUNTIME_UPDATES_ENV
from services.transport.internal_auth import InternalAuth
from services.transport.node_stats import read_stats
from tests.deploy.compose_local import ComposeDeployment
from tests.deploy.compose_spec import COMPOSE_FILE
from tests.deploy.netns_hosts import HostNetwork, namespaces_unavailable
from tests.factories import Video, chat_case, conversation, encode_image, make_clip, make_image
from tests.oracle import ReferenceOracle
from tests.peft_adapters import TOWER_TARGETS, make_adapter, merged_model
from tests.services.stack.stack_probes import Streams
from tests.video_oracle import oracle_case_tokens, oracle_video

FAMILIES = ["tiny", "gemma3-tiny", "qwen3vl-tiny", "qwen3_5-tiny"]
SCALE = {"preprocess": 1, "encoder": 2, "prefill": 2, "decode": 2, "gateway": 1}
MAX_TOKENS = 12
GREEDY = {"temperature": 0, "max_tokens": MAX_TOKENS, "extra_body": {"ignore_eos": True}}
# A shared prefix of several blocks ahead of the image, so a turn on the other prefill node has
# whole blocks to pull even where a hit may not end inside an image (Gemma3).
INTRO = "You are looking at a photograph from our archive; answer briefly and precisely. " * 3
NUM_STREAMS = 20
NUM_DISTINCT = 5
# Long enough that streams are still decoding once their node is found and killed.
STREAM_TOKENS = 256


class Deployment:
    """The running deployment as the tests see it: its gateway's URL, its oracle, its nodes."""

    def __init__(self, compose: ComposeDeployment, network: HostNetwork, model: str, oracle: ReferenceOracle) -> None:
        self.compose, self.network, self.model, self.oracle = compose, network, model, oracle
        self.planned = SCALE  # the replicas a reset restores (tests/deploy/deployment_reset.py)
        self.base_url = compose.gateway_url + "/v1"  # stack_probes.Streams reads this
        self.auth = InternalAuth((compose.volume_dirs["tessera-internal"] / "secret").read_bytes())

    def client(self, base_url: str | None = None) -> OpenAI:
        return OpenAI(base_url=base_url or self.base_url, api_key="unused", max_retries=0, timeout=180)

    def ask(self, case, base_url: str | None = None) -> str:
        reply = self.client(base_url).chat.completions.create(model=self.model, messages=case.body["messages"], **GREEDY)
        return reply.choices[0].message.content

    def expected(self, case, max_tokens: int = MAX_TOKENS) -> str:
        inputs = self.oracle.process(self.oracle.chat_text(case.oracle_messages), case.images)
        return self.oracle.tokenizer.decode(self.oracle.generate(inputs, max_tokens).token_ids, skip_special_tokens=True)

    def counter(self, name: str) -> float:
        text = httpx.get(self.compose.gateway_url + "/metrics", timeout=30).text
        for line in text.splitlines():
            if line.startswith(f"tessera_{name} "):
                return float(line.split()[1])
        return 0.0

    def logs(self) -> str:
        return "\n".join(self.compose.logs(s, tail_chars=1500) for s in ("gateway", "prefill", "encoder", "decode"))


@pytest.fixture(scope="module", params=FAMILIES)
def deployment(request, tmp_path_factory):
    reason = namespaces_unavailable()
    if reason is not None:
        pytest.skip(reason)
    from services.models.registry import resolve_model

    model = resolve_model(request.param, progress=lambda _m: None)  # built once, into the session's home
    home = Path(os.environ["TESSERA_HOME"])
    with HostNetwork() as network:
        compose = ComposeDeployment(
            COMPOSE_FILE,
            tmp_path_factory.mktemp(f"hosts-{request.param}"),
            volumes={"tessera-home": home},
            network=network,
            model=request.param,
            service_env=_service_env(request.param),
            startup_timeout_s=420,
        )
        try:
            compose.up(scale=SCALE)
            yield Deployment(compose, network, request.param, ReferenceOracle(model.path))
        finally:
            compose.down(timeout_s=20)


def _service_env(model: str) -> dict[str, dict[str, str]]:
    """Round robin on the gateway (each test's turns cross hosts); for tiny, LoRA on the roles
    that run adapters and runtime loads on the gateway (the LoRA test)."""
    env = {"gateway": {"TESSERA_SERVE_ROUTING_POLICY": "round_robin"}}
    if model == "tiny":
        lora = {"TESSERA_ENGINE_ENABLE_LORA": "1"}
        env = {"gateway": {**env["gateway"], **lora, RUNTIME_UPDATES_ENV: "True"}, "encoder": lora, "prefill": lora, "decode": lora}
    return env


def _png(seed: int, w: int = 96, h: int = 80) -> bytes:
    return encode_image(make_image(w, h, seed=seed))


def test_every_node_advertises_its_own_hosts_address(deployment):
    addresses = {host.address for host in deployment.network.hosts}
    nodes = httpx.get(deployment.compose.gateway_url + "/health", timeout=10).json()["nodes"]
    assert sorted(n["role"] for n in nodes) == sorted(r for r, n in SCALE.items() if r != "gateway" for _ in range(n))
    seen = set()
    for service in ("preprocess", "encoder", "prefill", "decode"):
        for i, replica in enumerate(deployment.compose.replicas(service)):
            plan = deployment.compose.plan(service, i)
            stats = read_stats(service, replica.grpc_address, deployment.auth, timeout_s=30)
            if service != "preprocess":
                assert stats.data_address == f"tcp://{plan.host}:50071", (service, stats.data_address)
            seen.add(plan.host)
    assert seen <= addresses and len(seen) == 7  # seven hosts, none of them this one


def test_image_requests_across_hosts_equal_the_oracle(deployment):
    names = ("prefill_embeddings_pulled_total", "prefill_kv_blocks_pulled_total", "processor_cache_hits_total")
    before = {name: deployment.counter(name) for name in names}
    image = _png(1)
    for i in range(3):  # cold, then the same image on the other prefill node and encoder, then back
        case = chat_case(INTRO, image, f"Question {i}: what is here?")
        assert deployment.ask(case) == deployment.expected(case), (f"sight {i}", deployment.logs())
    first = chat_case(INTRO, _png(2), "Describe it.")
    turns = [first, conversation(first, "A picture.", chat_case("And the colours?"))]
    turns.append(conversation(*turns[1:], "Mostly grey.", chat_case("Anything else?")))
    for i, case in enumerate(turns):  # turn by turn on alternating prefill nodes: the prefix is pulled
        assert deployment.ask(case) == deployment.expected(case), f"turn {i}"
    # Embeddings crossed from encoder hosts to prefill hosts, KV pages between prefill hosts; the
    # preprocess node processed the repeated image once.
    for name in names:
        assert deployment.counter(name) > before[name], name
    assert deployment.counter("prefill_kv_pull_failures_total") == 0


def test_video_across_hosts_equals_the_oracle_and_each_group_is_encoded_once(deployment):
    if deployment.model == "gemma3-tiny":
        pytest.skip("Gemma3 takes no video")
    clip = Video(make_clip(12, fps=4, width=96, height=64, seed=7))
    towers = ("encoder_items_encoded_total", "prefill_images_encoded_locally_total")
    before = sum(deployment.counter(name) for name in towers)
    pulled = deployment.counter("prefill_embeddings_pulled_total")
    for i in range(3):  # round robin: the clip's groups on both prefill hosts, from the encoder hosts
        case = chat_case(INTRO, clip, f"Question {i}: what happens?")
        expected = oracle_case_tokens(deployment.oracle, case, MAX_TOKENS)
        text = deployment.oracle.tokenizer.decode(expected.token_ids, skip_special_tokens=True)
        assert deployment.ask(case) == text, (f"sight {i}", deployment.logs())
    oracle = deployment.oracle
    num_groups = oracle_video(clip.data, oracle.model_dir).video_grid_thw[0]
    # Round robin puts the sights on encoders A, B, A: each encoder runs each group once, the
    # third sight none (the cache-aware policy's 1.00 per group: docs/benchmarks.md).
    assert sum(deployment.counter(name) for name in towers) - before == 2 * num_groups
    assert deployment.counter("prefill_embeddings_pulled_total") > pulled


def test_pixels_pushed_to_a_prefill_host_are_encoded_there(deployment):
    if deployment.model != "tiny":
        pytest.skip("one family shows the pixel path to a prefill node's address")
    extra = deployment.compose.add_replica("gateway", {"TESSERA_SERVE_ENCODE_DISPATCH": "prefill"})
    base_url = f"http://{extra.grpc_address.rpartition(':')[0]}:8000/v1"
    before = deployment.counter("prefill_images_encoded_locally_total")
    case = chat_case(_png(40, 72, 56), "Which shape is largest?")
    assert deployment.ask(case, base_url) == deployment.expected(case)
    assert deployment.counter("prefill_images_encoded_locally_total") == before + 1


def _busiest_decode_pid(deployment: Deployment, timeout_s: float = 60.0) -> int:
    replicas = deployment.compose.replicas("decode")
    deadline = time.monotonic() + timeout_s
    while True:
        running = [read_stats("decode", r.grpc_address, deployment.auth).gauges["engine_requests_running"] for r in replicas]
        if max(running) > 0:
            return replicas[running.index(max(running))].pid
        assert time.monotonic() < deadline, f"no decode node ran a stream within {timeout_s} s"
        time.sleep(0.02)


def test_a_decode_host_killed_under_20_streams_fails_none(deployment):
    if deployment.model != "tiny":
        pytest.skip("one family shows migration across hosts")
    # Five distinct requests, four streams each: the oracle runs five times, not twenty.
    distinct = [chat_case(_png(100 + i, 56 + 8 * i, 56), f"Tell me about picture {i}.") for i in range(NUM_DISTINCT)]
    cases = [distinct[i % NUM_DISTINCT] for i in range(NUM_STREAMS)]
    expected = [deployment.expected(case, STREAM_TOKENS) for case in distinct] * (NUM_STREAMS // NUM_DISTINCT)
    migrations = deployment.counter("gateway_migrations_total")
    streams = Streams(deployment, cases, {**GREEDY, "max_tokens": STREAM_TOKENS}, model=deployment.model)
    streams.wait_flowing(1)
    os.kill(_busiest_decode_pid(deployment), signal.SIGKILL)
    texts, errors = streams.join()
    assert not errors, (errors, deployment.logs())
    assert texts == expected
    assert deployment.counter("gateway_migrations_total") > migrations


ADAPTER_HOSTS = ("encoder", "prefill", "decode")  # the roles a runtime load of a tower adapter reaches


def _adapters_served(deployment: Deployment, role: str) -> list[float]:
    return [read_stats(role, r.grpc_address, deployment.auth).gauges["lora_adapters_served"] for r in deployment.compose.replicas(role)]


def test_an_adapter_loaded_at_runtime_is_served_across_hosts_by_the_hosts_holding_it(deployment, tmp_path):
    if deployment.model != "tiny":
        pytest.skip("one family shows LoRA placement across hosts")
    model_dir = deployment.oracle.model_dir
    adapter = make_adapter(model_dir, tmp_path / "c", seed=13, targets=TOWER_TARGETS)  # on the tower too: an encoder runs it
    oracle = ReferenceOracle(model_dir, load_model=False)
    oracle.model = merged_model(model_dir, adapter)
    extra = deployment.compose.add_replica("gateway", {"TESSERA_SERVE_ROUTING_POLICY": "cache_aware"})
    gateway = f"http://{extra.grpc_address.rpartition(':')[0]}:8000"
    loaded = httpx.post(gateway + "/v1/load_lora_adapter", json={"lora_name": "c", "lora_path": str(adapter)}, timeout=120)
    assert loaded.status_code == 200, loaded.text
    for role in ADAPTER_HOSTS:
        served = _adapters_served(deployment, role)
        assert sorted(served) == [0, 1], (role, served)  # one host of each role took it
    client = deployment.client(gateway + "/v1")
    for seed in (60, 61):
        case = chat_case(INTRO, _png(seed), "What is here?")
        inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images)
        expected = oracle.tokenizer.decode(oracle.generate(inputs, MAX_TOKENS).token_ids, skip_special_tokens=True)
        reply = client.chat.completions.create(model="c", messages=case.body["messages"], **GREEDY)
        assert reply.choices[0].message.content == expected, seed
    # Routed to the holders by their records: any other host would have been given the adapter first.
    for role in ADAPTER_HOSTS:
        served = _adapters_served(deployment, role)
        assert sorted(served) == [0, 1], (role, served)
    unloaded = httpx.post(gateway + "/v1/unload_lora_adapter", json={"lora_name": "c"}, timeout=60)
    assert unloaded.status_code == 200, unloaded.text
