"""Failures of the cache index and of a node, on the real multi-process stack (``tessera serve``),
driven by the official openai client and checked against the reference oracle.

* The index server (the embedded Valkey) is killed mid-load: requests keep succeeding from the
  nodes' local caches (encoder cache, prefix cache), outputs stay equal to the oracle, and once
  an index server is back on the same port every node registers again and republishes what it
  holds, including what it cached during the outage.
* An encoder holding an image is killed: within the heartbeat TTL the index stops naming it as a
  holder; the launcher restarts it under a new epoch that keeps its old entries hidden; the same
  image is served again (re-encoded) with oracle-equal output.
* The launcher restarts a dead embedded Valkey by itself, and the index catches up.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, fields

import pytest

from services.engine.config import EngineConfig
from services.preprocess.preprocessor import Preprocessor
from services.router.pending_encodes import PendingEncodes
from services.stack.redis_server import embedded_valkey_binary, start_redis_server
from services.transport.node_runtime import NodeSettings
from shared.hashing import MmSpan, block_hashes
from tests.factories import chat_case
from tests.services.stack.conftest import RunningStack, launch_stack, stop_stack
from tests.services.stack.stack_probes import (
    ask,
    index_is_up,
    is_serving,
    mm_hash_of,
    oracle_text,
    png_image,
    served_holders,
    stack_env,
    wait_until,
)

# The heartbeat TTL every node of a stack registers with (`--index-ttl-s`, default of NodeSettings).
TTL_S = float(next(f.default for f in fields(NodeSettings) if f.name == "index_ttl_s"))
ENCODED = "tessera_encoder_items_encoded_total"
PIXELS_SENT = "tessera_pixel_bytes_sent_total"
PIXELS_SKIPPED = "tessera_pixel_bytes_skipped_total"


@pytest.fixture(scope="module")
def preprocessor(tiny_model) -> Preprocessor:
    return Preprocessor(tiny_model)


# (image, question, encoder runs expected, expect a prefix-cache hit). Requests 0-2 run with the
# index up; the index is killed while request 3 streams; 4-8 run with it down.
OUTAGE_PLAN = [
    ("A", "What is this?", 1, False),
    ("B", "Describe the colours.", 1, False),
    ("A", "What is this?", 0, True),
    ("C", "Count the shapes.", 1, False),  # the index dies mid-request
    ("A", "What is this?", 0, True),  # exact repeats: encoder cache and prefix cache
    ("B", "What style is it?", 0, True),  # a repeated image, a new question
    ("D", "Name it.", 1, False),  # a new image is encoded without the index
    ("D", "Name it.", 0, True),
    ("C", "Count the shapes.", 0, True),  # encoded as the index died
]
KILL_AT = 3


@dataclass
class Outage:
    """One stack, its index and what the test expects of them."""

    stack: RunningStack
    index: object
    url: str
    node_ids: dict[str, str]  # role -> node id, for encoder, prefill and decode
    mm: dict[str, str]  # image name -> mm_hash
    blocks_a: list  # block hashes of the first request's prompt
    cases: list
    expected: list[str]

    def full_prefix(self) -> dict[str, int]:
        return dict.fromkeys((self.node_ids["prefill"], self.node_ids["decode"]), len(self.blocks_a))


def _serve_through_the_outage(outage: Outage, valkey_pid: int) -> None:
    stack, index, mm, encoder_id = outage.stack, outage.index, outage.mm, outage.node_ids["encoder"]

    def kill_the_index() -> None:
        os.kill(valkey_pid, signal.SIGKILL)
        assert wait_until(lambda: not index_is_up(outage.stack, outage.url), 10), "the index server did not die"

    for i, (case, (name, question, num_encoded, prefix_hit)) in enumerate(zip(outage.cases, OUTAGE_PLAN)):
        label = f"request {i} ({name}: {question!r})"
        if i == KILL_AT:  # what was published before the outage is in the index
            assert wait_until(lambda: served_holders(index, [mm["A"], mm["B"]]) == {mm["A"]: {encoder_id}, mm["B"]: {encoder_id}}, 10)
            assert wait_until(lambda: index.lookup([], outage.blocks_a).node_to_num_prefix_blocks == outage.full_prefix(), 10)
        if i > KILL_AT and num_encoded == 0:
            # The gateway's hint of an image it sent to be encoded outlives the request by
            # linger_s (pending_encodes.py); past it, without the index, only the mirror knows.
            time.sleep(PendingEncodes().linger_s)
        before = stack.metrics()
        text, cached = ask(stack, case, stream=i == KILL_AT, during=kill_the_index if i == KILL_AT else None)
        after = stack.metrics()
        assert text == outage.expected[i], label
        assert after[ENCODED] - before[ENCODED] == num_encoded, label
        assert (cached > 0) == prefix_hit, f"{label}: {cached} cached tokens"
        if num_encoded == 0:  # a repeated image's pixels never travel again, index or not
            assert after[PIXELS_SENT] == before[PIXELS_SENT], label
        if i > KILL_AT and num_encoded == 0:
            # Without the index (and past the hint) the router cannot know the encoder holds
            # the image: the gateway asks preprocess to push it, and preprocess's mirror skips it.
            assert after[PIXELS_SKIPPED] > before[PIXELS_SKIPPED], label
    assert not index_is_up(outage.stack, outage.url), "the whole outage phase must have run without an index"
    assert stack.metrics()[ENCODED] == 4  # one vision-tower run per distinct image, outage or not


def _restart_the_index_and_catch_up(outage: Outage) -> subprocess.Popen:
    """An empty index server comes back on the same port: every node registers again (a new
    epoch) and republishes its snapshot, including what it cached while the index was down."""
    index, encoder_id = outage.index, outage.node_ids["encoder"]
    valkey, restarted_url = start_redis_server(
        embedded_valkey_binary(), int(outage.url.rsplit(":", 1)[1].split("/")[0]), password=outage.stack.index_password
    )
    assert restarted_url == outage.url
    started = time.monotonic()
    everything = [outage.mm[name] for name in "ABCD"]
    caught_up = wait_until(lambda: served_holders(index, everything) == {h: {encoder_id} for h in everything}, 15, 0.2)
    assert caught_up, f"index did not catch up: {served_holders(index, everything)}"
    assert wait_until(lambda: index.lookup([], outage.blocks_a).node_to_num_prefix_blocks == outage.full_prefix(), 10)
    # Membership recovers too: every node, preprocess included, registers again (each on its
    # own retry cadence, behind its own circuit breaker's cooldown).
    roles = {"preprocess", "encoder", "prefill", "decode"}
    assert wait_until(lambda: {s.info.role for s in index.live_nodes().values()} == roles, 15, 0.2)
    print(f"index caught up {time.monotonic() - started:.1f}s after it came back")
    return valkey


def _route_from_the_index_again(outage: Outage, oracle, new_image: bytes) -> None:
    """The gateway knows the encoder holds A and asks preprocess to push nothing; A's prefix is
    cached. Publishing goes on: a new image is served and published under the new epoch."""
    stack = outage.stack
    # The gateway's circuit breaker closes at its first successful call after the cooldown.
    assert wait_until(lambda: stack.metrics()["tessera_gateway_index_breaker_open"] == 0, 15, 0.2)
    before = stack.metrics()
    text, cached = ask(stack, outage.cases[0])
    after = stack.metrics()
    assert text == outage.expected[0] and cached > 0
    assert all(after[name] == before[name] for name in (ENCODED, PIXELS_SENT, PIXELS_SKIPPED))
    case = chat_case(new_image, "And this one?")
    assert ask(stack, case)[0] == oracle_text(oracle, case)
    assert stack.metrics()[ENCODED] - after[ENCODED] == 1


def test_index_killed_mid_load_serving_goes_on_from_local_caches_and_the_index_catches_up(
    tmp_path, repo_root, tiny_model, oracle, preprocessor
):
    images = {name: png_image(seed) for name, seed in (("A", 301), ("B", 302), ("C", 303), ("D", 304), ("E", 305))}
    cases = [chat_case(images[name], question) for name, question, _, _ in OUTAGE_PLAN]
    mm = {name: mm_hash_of(preprocessor, chat_case(data, "x")) for name, data in images.items()}
    prep = preprocessor.preprocess(cases[0].prompt)
    blocks_a = block_hashes(prep.prompt_token_ids, EngineConfig().block_size, [MmSpan(i.mm_hash, i.placeholder) for i in prep.mm_items])
    expected = [oracle_text(oracle, case) for case in cases]
    valkey = None
    # --no-restart: the launcher leaves the dead index down, so the outage lasts as long as the test wants.
    stack = launch_stack(tmp_path, repo_root, "--no-restart", env=stack_env())
    try:
        state = stack.state()
        url = state["valkey"]["url"]
        node_ids = {role: f"{role}@{state['roles'][role]['grpc_address']}" for role in ("encoder", "prefill", "decode")}
        outage = Outage(stack, stack.index(tiny_model.model_id), url, node_ids, mm, blocks_a, cases, expected)
        _serve_through_the_outage(outage, state["valkey"]["pid"])
        valkey = _restart_the_index_and_catch_up(outage)
        _route_from_the_index_again(outage, oracle, images["E"])
        assert wait_until(lambda: served_holders(outage.index, [mm["E"]]) == {mm["E"]: {node_ids["encoder"]}}, 10)
        assert stack.process.poll() is None and all(r["restarts"] == 0 for r in stack.state()["roles"].values())
    finally:
        stop_stack(stack)
        if valkey is not None:  # started by this test, not by the launcher
            valkey.terminate()
            try:
                valkey.wait(timeout=5)
            except subprocess.TimeoutExpired:
                valkey.kill()


@pytest.fixture(scope="module")
def two_encoder_stack(tmp_path_factory, tiny_model, repo_root, preprocessor):
    # Embedding caches (encoder and prefill nodes alike) that hold one test image: the next image
    # evicts it, so the prefill node has to pull it from an encoder again.
    rows = preprocessor.preprocess(chat_case(png_image(0), "x").prompt).mm_items[0].placeholder.length
    budget = ["--encoder-cache-tokens", str(rows), "--max-encoder-tokens-per-step", str(rows)]
    running = launch_stack(tmp_path_factory.mktemp("two-encoders"), repo_root, "--encoders", "2", *budget, env=stack_env())
    yield running
    stop_stack(running)


def test_killed_encoder_stops_being_served_as_a_holder_within_the_ttl(two_encoder_stack, tiny_model, oracle, preprocessor):
    stack = two_encoder_stack
    index = stack.index(tiny_model.model_id)
    raw = stack.redis_client()
    case = chat_case(png_image(401), "What is in this picture?")
    expected = oracle_text(oracle, case)
    mm_hash = mm_hash_of(preprocessor, case)

    assert ask(stack, case)[0] == expected
    holders = wait_until(lambda: served_holders(index, [mm_hash])[mm_hash], 10)
    assert holders and len(holders) == 1, "exactly one encoder encodes the image"
    (holder,) = holders
    old_epoch = index.live_nodes()[holder].epoch
    role, info = next((r, i) for r, i in stack.state()["roles"].items() if f"encoder@{i['grpc_address']}" == holder)

    os.kill(info["pid"], signal.SIGKILL)
    killed = time.monotonic()
    # Its last heartbeat was at most TTL/3 ago, so its node key lapses within the TTL (or the
    # restarted node's new epoch hides the entry sooner); poll well inside that bound.
    assert wait_until(lambda: holder not in served_holders(index, [mm_hash])[mm_hash], TTL_S + 1.0, 0.05), "still served as a holder"
    hidden_after = time.monotonic() - killed
    assert hidden_after <= TTL_S + 0.5, f"hidden only after {hidden_after:.2f}s (TTL {TTL_S}s)"
    print(f"the killed encoder's entry stopped being served {hidden_after:.2f}s after the kill (TTL {TTL_S}s)")

    # The launcher restarts the encoder on the same address; it registers under a new epoch. Its
    # old entry is still stored in the index, and the epoch keeps it from being served. (Until the
    # restart, the dead encoder is still listed until its TTL lapses; a request placed on it
    # would be retried on the other encoder, but this test checks the index, not failover.)
    def restarted() -> bool:
        now = stack.state()["roles"][role]
        return now["restarts"] >= 1 and now["pid"] != info["pid"] and is_serving(info["grpc_address"])

    assert wait_until(restarted, 60, 0.5), "the launcher did not restart the killed encoder"
    assert wait_until(lambda: holder in index.live_nodes(), 10)
    assert index.live_nodes()[holder].epoch > old_epoch
    assert raw.hget(f"{index.inner.prefix}mm:{mm_hash}", holder).startswith(f"{old_epoch}|")  # stale, not deleted
    assert holder not in served_holders(index, [mm_hash])[mm_hash]

    # Another image evicts the first one from the prefill node's one-image embedding cache; the
    # first image again is then served by re-encoding it (no live encoder holds it), oracle-equal.
    # It follows other text: the same prompt again would hit the prefix cache, which covers the
    # image, and no tower would run (services/gateway's encoder skip).
    other = chat_case(png_image(402), "And this one?")
    assert ask(stack, other)[0] == oracle_text(oracle, other)
    again = chat_case("Look again.", png_image(401), "What is in this picture?")
    assert mm_hash_of(preprocessor, again) == mm_hash
    before = stack.metrics()[ENCODED]  # the restarted encoder counts from 0: compare from here
    assert ask(stack, again)[0] == oracle_text(oracle, again)
    assert stack.metrics()[ENCODED] - before == 1
    now_held_by = wait_until(lambda: served_holders(index, [mm_hash])[mm_hash], 10)
    assert now_held_by and len(now_held_by) == 1, "the re-encoded image is published by the encoder that encoded it"
    assert index.live_nodes()[next(iter(now_held_by))].info.role == "encoder"
    raw.close()


def test_launcher_restarts_a_dead_index_server_and_the_index_catches_up(two_encoder_stack, tiny_model, oracle, preprocessor):
    stack = two_encoder_stack
    state = stack.state()
    url, valkey = state["valkey"]["url"], state["valkey"]
    index = stack.index(tiny_model.model_id)
    case = chat_case(png_image(501), "Which colour dominates?")
    mm_hash = mm_hash_of(preprocessor, case)
    assert ask(stack, case)[0] == oracle_text(oracle, case)
    holders = wait_until(lambda: served_holders(index, [mm_hash])[mm_hash], 10)
    assert holders and len(holders) == 1

    os.kill(valkey["pid"], signal.SIGKILL)
    assert wait_until(lambda: stack.state()["valkey"]["restarts"] > valkey["restarts"], 15), "the launcher did not restart Valkey"
    assert stack.state()["valkey"]["url"] == url and stack.state()["valkey"]["pid"] != valkey["pid"]
    assert wait_until(lambda: served_holders(index, [mm_hash])[mm_hash] == holders, 15, 0.2), "the index did not catch up"
    members = ["decode", "encoder", "encoder", "prefill", "preprocess"]  # every node is a member again
    assert wait_until(lambda: sorted(s.info.role for s in index.live_nodes().values()) == members, 10), "every node registers again"
