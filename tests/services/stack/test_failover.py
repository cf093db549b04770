"""Nodes dying, joining and draining under streamed load, on a real 2/2/2/2 stack (two nodes of
every role) driven by the official openai client and checked against the reference oracle.

* One node of each role is SIGKILLed once streams are flowing, and more requests follow at once:
  no request fails, greedy output equals the oracle, requests sent to the dead node are retried
  elsewhere, and the streams cut on a dead decode node are migrated.
* An encoder started by hand later, with nothing but the index URL, gets work; SIGTERM drains it
  while requests run, and none of them fails.
* A gateway's SIGTERM lets its open streams finish and refuses new requests (on a 1/1/1/1 stack
  of its own).

A decode node is also killed under streams across hosts, per family (tests/deploy/test_netns_hosts.py).
"""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from services.stack.node_process import start_node, wait_serving
from services.transport.node_stats import read_stats
from tests.factories import chat_case, encode_image, make_image
from tests.services.stack.conftest import RunningStack, launch_stack, stop_stack
from tests.services.stack.stack_probes import Streams, busiest_decode_node

MAX_TOKENS = 96
# Streams on a decode node that dies or freezes: long enough that a loaded machine still finds
# them decoding once it has found their node (tiny decodes 96 tokens in a fraction of a second).
MIGRATION_TOKENS = 512
NUM_EARLY = 4  # streaming when the node dies
NUM_REQUESTS = 12  # the rest are sent right after
GREEDY = {"temperature": 0, "max_tokens": MAX_TOKENS, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, tiny_model, repo_root):
    running = launch_stack(
        tmp_path_factory.mktemp("failover"),
        repo_root,
        "--preprocess",
        "2",
        "--encoders",
        "2",
        "--prefill",
        "2",
        "--decode",
        "2",
        "--no-restart",
        internal_secret="failover-test-internal-secret",  # for the nodes it adds by hand, and their Stats
    )
    yield running
    stop_stack(running)


def _cases(seed: int) -> list:
    return [
        chat_case(encode_image(make_image(56 + 14 * (i % 3), 56, seed=seed + i)), f"Question {i}: what is here?")
        for i in range(NUM_REQUESTS)
    ]


def _oracle_text(oracle, case, max_tokens: int = MAX_TOKENS) -> str:
    tokens = oracle.generate(oracle.process(oracle.chat_text(case.oracle_messages), case.images), max_tokens).token_ids
    return oracle.tokenizer.decode(tokens, skip_special_tokens=True)


def _gateway_counter(stack: RunningStack, name: str) -> float:
    return stack.metrics().get(f"tessera_{name}", 0.0)


def _wait_for_all_nodes(stack: RunningStack, num_nodes: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    base = stack.base_url.removesuffix("/v1")
    while time.monotonic() < deadline:
        reply = httpx.get(base + "/health", timeout=10)
        if reply.status_code == 200 and len(reply.json()["nodes"]) == num_nodes:
            return
        time.sleep(0.3)
    pytest.fail(f"the stack did not get back to {num_nodes} live nodes: {httpx.get(base + '/health').text}")


def _num_live_nodes(stack: RunningStack) -> int:
    count = 0
    for name, role in stack.state()["roles"].items():
        if name != "gateway":
            try:
                os.kill(role["pid"], 0)
                count += 1
            except ProcessLookupError:
                pass
    return count


# One node of each role, on the shared 2/2/2/2 cluster: it runs with --no-restart, so each test
# kills a node of another role and one node of every role is left.
@pytest.mark.parametrize("role", ["decode", "prefill", "encoder", "preprocess"])
def test_killing_a_node_mid_stream_fails_no_request_and_output_equals_the_oracle(cluster, oracle, role):
    """The stack runs with --no-restart, so the dead node stays dead: requests routed after the
    kill still find it listed in the index (until its TTL lapses) and must fail over."""
    _wait_for_all_nodes(cluster, _num_live_nodes(cluster))
    cases = _cases(seed={"decode": 10, "prefill": 30, "encoder": 50, "preprocess": 70}[role])
    num_early_tokens = MIGRATION_TOKENS if role == "decode" else MAX_TOKENS
    expected = [_oracle_text(oracle, case, num_early_tokens if i < NUM_EARLY else MAX_TOKENS) for i, case in enumerate(cases)]
    before = {name: _gateway_counter(cluster, name) for name in ("gateway_migrations_total", "gateway_node_failures_total")}
    early = Streams(cluster, cases[:NUM_EARLY], {**GREEDY, "max_tokens": num_early_tokens})
    if role == "decode":
        early.wait_flowing(1)  # every stream decoding now has nearly all its tokens ahead of it
        victim = busiest_decode_node(cluster)
    else:
        early.wait_flowing(NUM_EARLY)  # every early stream is decoding, on both decode nodes
        victim = cluster.state()["roles"][role]
    os.kill(victim["pid"], signal.SIGKILL)
    late = Streams(cluster, cases[NUM_EARLY:], GREEDY)  # these still need every role
    (early_texts, early_errors), (late_texts, late_errors) = early.join(), late.join()
    assert not early_errors and not late_errors, (early_errors + late_errors, cluster.log_tail())
    assert early_texts + late_texts == expected
    num_failures = _gateway_counter(cluster, "gateway_node_failures_total") - before["gateway_node_failures_total"]
    num_migrations = _gateway_counter(cluster, "gateway_migrations_total") - before["gateway_migrations_total"]
    print(f"killed {role}: {num_failures:.0f} node failures retried, {num_migrations:.0f} streams migrated")
    assert num_failures > 0  # the dead node was chosen and the request went elsewhere
    if role == "decode":
        assert num_migrations > 0


def test_a_node_started_by_hand_joins_gets_work_and_drains_without_losing_a_request(cluster, oracle, tmp_path):
    num_nodes = _num_live_nodes(cluster)
    _wait_for_all_nodes(cluster, num_nodes)
    log = open(tmp_path / "encoder-extra.log", "w")
    extra, grpc_address = start_node("encoder", model="tiny", index_url=cluster.state()["valkey"]["url"], log=log, env=cluster.node_env())
    try:
        wait_serving(grpc_address, 120, extra)
        _wait_for_all_nodes(cluster, num_nodes + 1)
        cases = _cases(seed=90)
        expected = [_oracle_text(oracle, case) for case in cases]
        # 8 new images over 2 encoders: ties are broken by a hash of each image, so the new node
        # gets none of them with probability 2^-8 only (and load breaks ties its way sooner).
        texts, errors = Streams(cluster, cases[:8], GREEDY).join()
        assert not errors and texts == expected[:8]
        assert _encoded_by(cluster, grpc_address) > 0, "the new encoder got no work"
        # Scale in: SIGTERM drains it while requests for new images are in flight.
        streams = Streams(cluster, cases[8:], GREEDY)
        streams.wait_flowing(1)
        extra.send_signal(signal.SIGTERM)
        texts, errors = streams.join()
        assert not errors, (errors, cluster.log_tail())
        assert texts == expected[8:]
        assert extra.wait(timeout=60) == 0
        _wait_for_all_nodes(cluster, num_nodes)  # it deregistered
    finally:
        if extra.poll() is None:
            extra.kill()
        log.close()


def test_a_frozen_decode_node_is_detected_in_seconds_and_its_streams_migrate(cluster, oracle, tmp_path):
    """SIGSTOP freezes every thread of a decode node, keepalive answers included (a hung host, or
    one whose network vanished): the gateway's keepalive pings go unanswered, the streams fail
    within seconds instead of at their deadline, and they continue on another decode node."""
    num_nodes = _num_live_nodes(cluster)
    _wait_for_all_nodes(cluster, num_nodes)
    log = open(tmp_path / "decode-extra.log", "w")
    extra, grpc_address = start_node("decode", model="tiny", index_url=cluster.state()["valkey"]["url"], log=log, env=cluster.node_env())
    try:
        wait_serving(grpc_address, 120, extra)
        _wait_for_all_nodes(cluster, num_nodes + 1)
        cases = _cases(seed=110)[:6]
        expected = [_oracle_text(oracle, case, MIGRATION_TOKENS) for case in cases]
        migrations_before = _gateway_counter(cluster, "gateway_migrations_total")
        streams = Streams(cluster, cases, {**GREEDY, "max_tokens": MIGRATION_TOKENS})  # still decoding at the freeze
        streams.wait_flowing(len(cases))
        # Least-loaded placement alternates between the two decode nodes.
        assert _decode_requests(cluster, grpc_address) > 0, "no stream was placed on the node about to freeze"
        extra.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        texts, errors = streams.join()
        took = time.monotonic() - frozen
        assert not errors and texts == expected
        assert _gateway_counter(cluster, "gateway_migrations_total") > migrations_before
        print(f"streams on a frozen decode node completed elsewhere {took:.1f}s after the freeze")
        assert took < 30  # keepalive (2 s + 2 s), not the 300 s request deadline
    finally:
        extra.send_signal(signal.SIGCONT)
        extra.kill()
        extra.wait(timeout=30)
        log.close()


def _decode_requests(stack: RunningStack, grpc_address: str) -> float:
    return read_stats("decode", grpc_address, stack.internal_auth()).counters["decode_requests_total"]


def _encoded_by(stack: RunningStack, grpc_address: str) -> float:
    return read_stats("encoder", grpc_address, stack.internal_auth()).counters["encoder_items_encoded_total"]


@pytest.fixture
def small_cluster(tmp_path, repo_root):
    """One node of each role: a gateway's drain needs no more, and the suite starts it faster."""
    running = launch_stack(tmp_path, repo_root, "--no-restart")
    yield running
    stop_stack(running)


def test_a_draining_gateway_finishes_its_open_streams_and_refuses_new_requests(small_cluster, oracle):
    """It stops its stack's gateway, so it has a stack of its own."""
    cluster = small_cluster
    cases = _cases(seed=130)[:NUM_EARLY]
    expected = [_oracle_text(oracle, case) for case in cases]
    gateway = cluster.state()["roles"]["gateway"]
    streams = Streams(cluster, cases, GREEDY)
    streams.wait_flowing(NUM_EARLY)
    os.kill(gateway["pid"], signal.SIGTERM)
    texts, errors = streams.join()
    assert not errors and texts == expected
    with pytest.raises(httpx.HTTPError):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # refused once the listener is closed, then gone
            httpx.get(cluster.base_url.removesuffix("/v1") + "/health", timeout=5)
            time.sleep(0.2)
