"""Cross-node reuse on one stack (1 encoder, 2 prefill, 1 decode; round_robin placement, index on):

* a multi-turn conversation whose turns alternate between the two prefill nodes recomputes no
  full block computed before, anywhere: the missing prefix is pulled from the peer (prefill or
  decode node) holding it, and every turn's output equals the oracle;
* a preprocess node that lost its processor cache (restarted) does not run the image processor
  for an image whose embeddings the index says an encoder holds: it takes the placeholder
  metadata from the index, sends no pixels, and the output still equals the oracle.
"""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest
from openai import APIStatusError, OpenAI

from services.gateway.frontend.prompt_wire import prompt_for_library
from services.preprocess.preprocessor import Preprocessor
from shared.hashing import MmSpan, block_hashes
from tests.factories import chat_case, encode_image, make_image
from tests.services.stack.conftest import launch_stack, stop_stack
from tests.services.stack.stack_probes import is_serving

BLOCK = 16  # the engine default, used by every node of the stack
QUESTIONS = ["Describe this image in detail.", "What else can you see?", "Summarise that in one sentence."]


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def _held_prefix_blocks(index, hashes, deadline_s: float = 10.0) -> int:
    """The longest prefix of ``hashes`` one live node holds, in blocks, per the index. Publishing is
    asynchronous, so wait (bounded) until the count stops growing."""
    best, stable_since = -1, time.monotonic()
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        count = max(index.lookup([], hashes).node_to_num_prefix_blocks.values(), default=0)
        if count != best:
            best, stable_since = count, time.monotonic()
        elif time.monotonic() - stable_since > 1.0:
            break
        time.sleep(0.2)
    return best


@pytest.fixture(scope="module")
def reuse_stack(tmp_path_factory, repo_root, tiny_model):
    running = launch_stack(
        tmp_path_factory.mktemp("reuse"), repo_root, "--encoders", "1", "--prefill", "2", "--decode", "1", "--routing-policy", "round_robin"
    )
    index = running.index(tiny_model.model_id)
    yield running, index
    index.close()
    stop_stack(running)


def _oracle_text(oracle, messages, images, max_tokens: int = 12) -> str:
    inputs = oracle.process(oracle.chat_text(messages), images)
    return oracle.tokenizer.decode(oracle.generate(inputs, max_tokens).token_ids, skip_special_tokens=True)


def test_turns_on_different_prefill_nodes_recompute_no_block_computed_before(reuse_stack, tiny_model, oracle):
    running, index = reuse_stack
    url = running.base_url.removesuffix("/v1")
    preprocessor = Preprocessor(tiny_model)
    client = OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=120)
    case = chat_case(encode_image(make_image(224, 168, seed=900)), QUESTIONS[0])
    messages, oracle_messages = list(case.body["messages"]), list(case.oracle_messages)
    for turn, question in enumerate(QUESTIONS):
        if turn:
            messages.append({"role": "user", "content": [{"type": "text", "text": question}]})
            oracle_messages.append({"role": "user", "content": [{"type": "text", "text": question}]})
        prep = preprocessor.preprocess(prompt_for_library({"messages": messages}))
        hashes = block_hashes(prep.prompt_token_ids, BLOCK, [MmSpan(i.mm_hash, i.placeholder) for i in prep.mm_items])
        num_computable = (len(prep.prompt_token_ids) - 1) // BLOCK  # the last token is always computed
        held_before = min(_held_prefix_blocks(index, hashes), num_computable) if turn else 0
        computed_before = _metric(url, "tessera_prefill_tokens_computed_total")

        reply = client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=12)
        answer = reply.choices[0].message.content

        inputs = oracle.process(oracle.chat_text(oracle_messages), case.images)
        assert answer == _oracle_text(oracle, oracle_messages, case.images), f"turn {turn}"
        assert reply.usage.prompt_tokens == len(inputs.token_ids) == len(prep.prompt_token_ids)
        # Every block some node computed before is reused, none recomputed (counted).
        assert reply.usage.prompt_tokens_details.cached_tokens == held_before * BLOCK, f"turn {turn}"
        computed = _metric(url, "tessera_prefill_tokens_computed_total") - computed_before
        assert computed == reply.usage.prompt_tokens - held_before * BLOCK
        if turn:
            # Turns alternate between the two prefill nodes, so reuse needed a pull, and at
            # least the previous turn's whole prompt was held somewhere.
            previous = len(preprocessor.preprocess(prompt_for_library({"messages": messages[:-2]})).prompt_token_ids)
            assert held_before >= min(previous // BLOCK, num_computable) > 0
        messages.append({"role": "assistant", "content": answer})
        oracle_messages.append({"role": "assistant", "content": answer})
    assert _metric(url, "tessera_prefill_kv_blocks_pulled_total") > 0
    assert _metric(url, "tessera_prefill_kv_pull_failures_total") == 0


def test_restarted_preprocess_skips_processing_pixels_an_encoder_holds(reuse_stack, oracle):
    running, index = reuse_stack
    url = running.base_url.removesuffix("/v1")
    client = OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=120)
    case = chat_case(encode_image(make_image(196, 140, seed=901)), "What colour is the largest shape?")

    def ask() -> str:
        return (
            client.chat.completions.create(model="tiny", messages=case.body["messages"], temperature=0, max_tokens=12)
            .choices[0]
            .message.content
        )

    assert ask() == _oracle_text(oracle, case.oracle_messages, case.images)

    # A fresh preprocess process: its processor cache and sender mirror are empty.
    before = running.state()["roles"]["preprocess"]
    os.kill(before["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 120
    while running.state()["roles"]["preprocess"]["restarts"] == before["restarts"]:
        assert time.monotonic() < deadline, "the launcher did not restart preprocess"
        time.sleep(0.5)
    # The gateway's counters are cumulative across a node's restart (it sees the new process's
    # zeros once it serves): compare from there.
    while not is_serving(before["grpc_address"]):
        assert time.monotonic() < deadline, "the restarted preprocess node does not serve"
        time.sleep(0.1)
    encoded, pixels_sent = _metric(url, "tessera_encoder_items_encoded_total"), _metric(url, "tessera_pixel_bytes_sent_total")
    skipped, misses = _metric(url, "tessera_preprocess_images_skipped_total"), _metric(url, "tessera_processor_cache_misses_total")

    deadline = time.monotonic() + 60  # the gateway answers 503 until the new process serves
    while True:
        try:
            answer = ask()
            break
        except APIStatusError as exc:
            assert exc.status_code == 503 and time.monotonic() < deadline, exc
            time.sleep(0.5)
    assert answer == _oracle_text(oracle, case.oracle_messages, case.images)
    assert _metric(url, "tessera_preprocess_images_skipped_total") - skipped == 1
    assert _metric(url, "tessera_processor_cache_misses_total") - misses == 1  # decoded and hashed, never processed
    assert _metric(url, "tessera_encoder_items_encoded_total") == encoded
    assert _metric(url, "tessera_pixel_bytes_sent_total") == pixels_sent
