"""The encoder skip through a stack (services/router/coverage.py): an image the chosen prefill
node's cached prefix covers is never encoded and its pixels never move, and a prefix that is gone
by the time the request runs costs a pixel push, never output.

Default suite, on the shared stack: a second turn about one image is routed as covered and stays
exact; a prefix the index claims (forged) but the node lacks takes the fallback and stays exact.
Per family, on a 2/2/2 stack whose embedding caches hold one image:
each later turn of a conversation about an image evicted from every embedding cache runs no tower
and moves no pixels, exact against transformers on every turn."""

from __future__ import annotations

import os
import secrets
import time

import pytest
from openai import OpenAI

from services.bench.cache_rates import TOWER_RUNS
from services.gateway.frontend.prompt_wire import prompt_for_library
from services.preprocess.preprocessor import Preprocessor
from shared.hashing import MmSpan, block_hashes
from shared.index.types import IndexEvents
from tests.factories import ChatCase, chat_case, conversation, encode_image, make_image
from tests.services.stack.conftest import launch_stack, stop_stack
from tests.services.stack.e2e_helpers import client_for

BLOCK = 16  # the stacks' block size (EngineConfig's default)
MAX_TOKENS = 10
QUESTIONS = ("What is in this picture?", "What colour is the largest shape?", "Is anything round?")


def _oracle_text(oracle, case: ChatCase) -> str:
    inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images)
    return oracle.tokenizer.decode(oracle.generate(inputs, MAX_TOKENS).token_ids, skip_special_tokens=True)


def _ask(client: OpenAI, case: ChatCase, model: str) -> str:
    reply = client.chat.completions.create(
        model=model, messages=case.body["messages"], temperature=0, max_tokens=MAX_TOKENS, extra_body={"ignore_eos": True}
    )
    return reply.choices[0].message.content


def _counts(stack) -> dict[str, float]:
    metrics = stack.metrics()
    return {
        "towers": sum(metrics.get(name, 0.0) for name in TOWER_RUNS),
        "pixel_bytes": metrics.get("tessera_pixel_bytes_sent_total", 0.0),
        "covered": metrics.get("tessera_gateway_images_covered_total", 0.0),
        "fallbacks": metrics.get("tessera_gateway_cover_fallbacks_total", 0.0),
    }


def _conversation_turns(stack, oracle, image: bytes, model: str, evict=None) -> list[dict[str, float]]:
    """Each turn's counter deltas; every answer equals transformers' greedy generate."""
    client, turns, deltas = client_for(stack), [], []
    for question in QUESTIONS:
        if evict is not None and turns:
            evict()
        case = conversation(*turns, chat_case(image, question) if not turns else chat_case(question))
        before = _counts(stack)
        answer = _ask(client, case, model)
        assert answer == _oracle_text(oracle, case), f"turn {len(deltas)}"
        after = _counts(stack)
        deltas.append({k: after[k] - before[k] for k in after})
        turns = [*turns, chat_case(image, question) if not turns else chat_case(question), answer]
    return deltas


def test_later_turns_about_one_image_are_routed_as_covered_and_stay_exact(stack, oracle):
    deltas = _conversation_turns(stack, oracle, encode_image(make_image(112, 84, seed=501)), "tiny")
    assert deltas[0]["covered"] == 0 and all(d["covered"] == 1 for d in deltas[1:]), deltas
    assert all(d["towers"] == 0 and d["pixel_bytes"] == 0 for d in deltas[1:]), deltas


def test_a_prefix_the_index_claims_but_the_node_lacks_falls_back_to_encoding_and_stays_exact(stack, oracle, tiny_model):
    """The index is told (forged) that the prefill node holds every block of a new request: the
    router skips its image, the node finds no prefix and asks for the embeddings, the gateway
    pushes the pixels then."""
    case = chat_case(encode_image(make_image(98, 70, seed=502)), "Describe the shapes in this picture, one by one, please.")
    prep = Preprocessor(tiny_model).preprocess(prompt_for_library(case.body))
    hashes = block_hashes(prep.prompt_token_ids, BLOCK, [MmSpan(i.mm_hash, i.placeholder) for i in prep.mm_items])
    index = stack.index(tiny_model.model_id)
    try:
        [(node_id, node)] = [(n, s) for n, s in index.live_nodes().items() if s.info.role == "prefill"]
        index.publish(node_id, node.epoch, IndexEvents(kv_stored={h: "device" for h in hashes}))
    finally:
        index.close()
    before = _counts(stack)
    assert _ask(client_for(stack), case, "tiny") == _oracle_text(oracle, case)
    after = _counts(stack)
    assert after["covered"] - before["covered"] == 1 and after["fallbacks"] - before["fallbacks"] == 1
    assert after["towers"] - before["towers"] == 1 and after["pixel_bytes"] > before["pixel_bytes"]


FAMILIES = ["tiny", "qwen3vl-tiny", "gemma3-tiny"]


@pytest.fixture(scope="module", params=FAMILIES)
def one_image_caches(request, tmp_path_factory, repo_root):
    """A 2/2/2 stack whose embedding caches (encoders' and prefill nodes') hold one image."""
    from services.models.registry import resolve_model
    from tests.oracle import ReferenceOracle

    model = resolve_model(request.param, progress=lambda _m: None)
    rows = Preprocessor(model).preprocess(prompt_for_library(chat_case(_image(0), "?").body)).mm_items[0].placeholder.length
    env = {**os.environ, "TESSERA_ENGINE_ENCODER_CACHE_TOKENS": str(rows), "TESSERA_ENGINE_MAX_ENCODER_TOKENS_PER_STEP": str(rows)}
    running = launch_stack(
        tmp_path_factory.mktemp(f"skip-{request.param}"),
        repo_root,
        *("--model", request.param, "--encoders", "2", "--prefill", "2", "--decode", "2"),
        env=env,
        internal_secret=secrets.token_hex(16),
    )
    yield running, request.param, ReferenceOracle(model.path), model.model_id
    stop_stack(running)


def _wait_until_idle(stack, namespace: str) -> None:
    """Until every node's record says idle, and the gateway has listed the records since.

    A heartbeat's load is up to ttl/3 old (shared/index/publisher.py): sent while the last
    evicting request ran, it says the node holding the conversation is busy, and the router
    rightly sends the next turn to the idle node, which holds no prefix. The claim here is about
    equal loads, so the test waits for them."""
    index = stack.index(namespace)
    try:
        for _ in range(100):  # 10 s at most: heartbeats come every ttl/3
            if all(state.load == 0 for state in index.live_nodes().values()):
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"nodes still busy: {index.live_nodes()}")
    finally:
        index.close()
    time.sleep(1.5)  # the gateway lists the records every second (Membership.refresh_s)


def _image(seed: int) -> bytes:
    return encode_image(make_image(112, 112, seed=600 + seed))


def test_turns_about_an_image_every_embedding_cache_let_go_run_no_tower_and_move_no_pixels(one_image_caches):
    stack, model, oracle, namespace = one_image_caches
    client, others = client_for(stack), iter(range(1, 100))

    def evict() -> None:  # other images through both encoders and both prefill nodes
        for _ in range(4):
            _ask(client, chat_case(_image(next(others)), "?"), model)
        _wait_until_idle(stack, namespace)

    deltas = _conversation_turns(stack, oracle, _image(0), model, evict=evict)
    assert deltas[0]["towers"] == 1 and deltas[0]["pixel_bytes"] > 0
    assert all(d["covered"] == 1 and d["towers"] == 0 and d["pixel_bytes"] == 0 for d in deltas[1:]), deltas
