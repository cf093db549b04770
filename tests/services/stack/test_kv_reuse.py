"""Prefix reuse across nodes: a multi-turn conversation whose turns alternate between two prefill
nodes (round_robin placement, index on) recomputes no full block computed before, anywhere; the
missing prefix is pulled from the peer (prefill or decode node) holding it, and every turn's
output equals the oracle."""

from __future__ import annotations

import time

import httpx
from openai import OpenAI

from services.preprocess import Preprocessor
from shared.hashing import MmSpan, block_hashes
from shared.index.backend import create_index
from tests.factories import chat_case, encode_image, make_image
from tests.services.stack.conftest import launch_stack, stop_stack

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


def test_turns_on_different_prefill_nodes_recompute_no_block_computed_before(repo_root, tiny_model, oracle, tmp_path):
    running = launch_stack(tmp_path, repo_root, "--encoders", "1", "--prefill", "2", "--decode", "1", "--routing-policy", "round_robin")
    url = running.base_url.removesuffix("/v1")
    index = None
    try:
        index = create_index(running.state()["valkey"]["url"], namespace=tiny_model.model_id)
        preprocessor = Preprocessor(tiny_model)
        client = OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=120)
        case = chat_case(encode_image(make_image(224, 168, seed=900)), QUESTIONS[0])
        messages, oracle_messages = list(case.body["messages"]), list(case.oracle_messages)
        for turn, question in enumerate(QUESTIONS):
            if turn:
                messages.append({"role": "user", "content": [{"type": "text", "text": question}]})
                oracle_messages.append({"role": "user", "content": [{"type": "text", "text": question}]})
            prep = preprocessor.preprocess({"messages": messages})
            hashes = block_hashes(prep.prompt_token_ids, BLOCK, [MmSpan(i.mm_hash, i.placeholder) for i in prep.mm_items])
            num_computable = (len(prep.prompt_token_ids) - 1) // BLOCK  # the last token is always computed
            held_before = min(_held_prefix_blocks(index, hashes), num_computable) if turn else 0
            computed_before = _metric(url, "tessera_prefill_tokens_computed_total")

            reply = client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=12)
            answer = reply.choices[0].message.content

            inputs = oracle.process(oracle.chat_text(oracle_messages), case.images)
            expected = oracle.tokenizer.decode(oracle.generate(inputs, 12).token_ids, skip_special_tokens=True)
            assert answer == expected, f"turn {turn}"
            assert reply.usage.prompt_tokens == len(inputs.token_ids) == len(prep.prompt_token_ids)
            # Every block some node computed before is reused, none recomputed (counted).
            assert reply.usage.prompt_tokens_details.cached_tokens == held_before * BLOCK, f"turn {turn}"
            computed = _metric(url, "tessera_prefill_tokens_computed_total") - computed_before
            assert computed == reply.usage.prompt_tokens - held_before * BLOCK
            if turn:
                # Turns alternate between the two prefill nodes, so reuse needed a pull, and at
                # least the previous turn's whole prompt was held somewhere.
                previous = len(preprocessor.preprocess({"messages": messages[:-2]}).prompt_token_ids)
                assert held_before >= min(previous // BLOCK, num_computable) > 0
            messages.append({"role": "assistant", "content": answer})
            oracle_messages.append({"role": "assistant", "content": answer})
        assert _metric(url, "tessera_prefill_kv_blocks_pulled_total") > 0
        assert _metric(url, "tessera_prefill_kv_pull_failures_total") == 0
    finally:
        if index is not None:
            index.close()
        stop_stack(running)
