"""Every cache path of a real multi-process stack, for each model family beside Qwen2-VL's own
suites (Gemma3, Qwen3-VL): one preprocess node, two encoders, three prefill and two decode nodes, round-robin
placement (so repeats land on other nodes and must be reused across nodes), driven by the official
openai client and checked token for token against the family's oracle.

Paths, each asserted by the counter that proves it ran:
  cold request; processor-cache hit (the one preprocess node sees the image again); encoder-cache
  hit (the third sight of an image is back on its first encoder, but on a prefill node that has
  not seen it: two encoders against three prefill nodes); cross-node embedding pull
  (prefill nodes take every image's rows from an encoder); prefix hit and cross-node KV pull (a
  long shared prefix, turn by turn on rotating prefill nodes); a 2/2/2 topology and more; a decode
  node killed mid-stream, whose streams migrate. And a LoRA adapter made by peft on the language
  model and the vision tower (--lora-modules t=PATH), selected by ``model``: exact against
  transformers with it merged, cold and on a repeat.
"""

from __future__ import annotations

import os
import secrets
import signal

import pytest

from tests.factories import chat_case, conversation, encode_image, make_image
from tests.oracle import ReferenceOracle
from tests.peft_adapters import TOWER_TARGETS, make_adapter, merged_model
from tests.services.stack.conftest import RunningStack, launch_stack, stop_stack
from tests.services.stack.e2e_helpers import client_for
from tests.services.stack.stack_probes import Streams, busiest_decode_node

MAX_TOKENS = 12
GREEDY = {"temperature": 0, "max_tokens": MAX_TOKENS, "extra_body": {"ignore_eos": True}}
FAMILY_MODELS = ["gemma3-tiny", "qwen3vl-tiny"]
# A shared prefix of several blocks ahead of the image, so prefix reuse has blocks to hit even
# where a hit may not end inside an image (Gemma3).
INTRO = "You are looking at a photograph from our archive; answer briefly and precisely. " * 3


# Beside the families' runs across hosts (tests/deploy/test_netns_hosts.py), this loopback
# topology adds the encoder-cache hit on a third prefill node and a migration per family.


@pytest.fixture(scope="module", params=FAMILY_MODELS)
def family_stack(request, tmp_path_factory, repo_root):
    from services.models.registry import resolve_model

    model = resolve_model(request.param, progress=lambda _m: None)
    root = tmp_path_factory.mktemp(request.param)
    adapter = make_adapter(model.path, root / "adapter-t", seed=21, targets=TOWER_TARGETS)
    running = launch_stack(
        root,
        repo_root,
        *("--model", request.param, "--preprocess", "1", "--encoders", "2", "--prefill", "3", "--decode", "2"),
        *("--routing-policy", "round_robin", "--enable-lora", "--lora-modules", f"t={adapter}"),
        internal_secret=secrets.token_hex(16),  # to read the decode nodes' Stats
    )
    running.served_model = request.param  # a built-in is served under its own name
    running.adapter_oracle = ReferenceOracle(model.path, load_model=False)
    running.adapter_oracle.model = merged_model(model.path, adapter)
    yield running, ReferenceOracle(model.path)
    stop_stack(running)


def _png(seed: int, w: int = 96, h: int = 80) -> bytes:
    return encode_image(make_image(w, h, seed=seed))


def _oracle_text(oracle: ReferenceOracle, case, max_tokens: int = MAX_TOKENS) -> str:
    inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images)
    return oracle.tokenizer.decode(oracle.generate(inputs, max_tokens).token_ids, skip_special_tokens=True)


def _ask(stack: RunningStack, case) -> tuple[str, int]:
    reply = client_for(stack).chat.completions.create(model=stack.served_model, messages=case.body["messages"], **GREEDY)
    return reply.choices[0].message.content, reply.usage.prompt_tokens_details.cached_tokens


def _counter(stack: RunningStack, name: str) -> float:
    return stack.metrics().get(f"tessera_{name}", 0.0)


def test_every_cache_path_matches_the_oracle(family_stack):
    stack, oracle = family_stack
    names = ("processor_cache_hits_total", "encoder_cache_hits_total", "prefill_embeddings_pulled_total", "prefill_kv_blocks_pulled_total")
    before = {name: _counter(stack, name) for name in names}
    image = _png(1)
    cases = [chat_case(INTRO, image, f"Question {i}: what is here?") for i in range(3)]
    for i, case in enumerate(cases):  # cold, then the same image on the other encoder, then back
        text, _ = _ask(stack, case)
        assert text == _oracle_text(oracle, case), f"sight {i} of the image"
    first = chat_case(INTRO, _png(2), "Describe it.")
    turns = [first, conversation(first, "A picture.", chat_case("And the colours?"))]
    turns.append(conversation(*turns[1:], "Mostly grey.", chat_case("Anything else?")))
    cached = []
    for i, case in enumerate(turns):  # each turn on the other prefill node: its prefix is pulled or hit
        text, num_cached = _ask(stack, case)
        assert text == _oracle_text(oracle, case), f"turn {i}"
        cached.append(num_cached)
    after = {name: _counter(stack, name) for name in names}
    assert after["processor_cache_hits_total"] > before["processor_cache_hits_total"]
    assert after["encoder_cache_hits_total"] > before["encoder_cache_hits_total"]
    assert after["prefill_embeddings_pulled_total"] > before["prefill_embeddings_pulled_total"]
    assert after["prefill_kv_blocks_pulled_total"] > before["prefill_kv_blocks_pulled_total"]
    assert all(n > 0 for n in cached[1:]), cached


def test_a_decode_node_killed_mid_stream_migrates_and_stays_exact(family_stack):
    stack, oracle = family_stack
    # Streams long enough that a loaded machine still finds them decoding once it has found their
    # decode node (a tiny model decodes 96 tokens in a fraction of a second).
    greedy = {**GREEDY, "max_tokens": 512}
    cases = [chat_case(_png(10 + i, 64 + 16 * i, 64), f"Tell me about picture {i}.") for i in range(4)]
    expected = [_oracle_text(oracle, case, 512) for case in cases]
    migrations = _counter(stack, "gateway_migrations_total")
    streams = Streams(stack, cases, greedy, model=stack.served_model)
    streams.wait_flowing(1)  # every stream decoding now has nearly all its tokens ahead of it
    os.kill(busiest_decode_node(stack)["pid"], signal.SIGKILL)
    texts, errors = streams.join()
    assert not errors, (errors, stack.log_tail())
    assert texts == expected
    assert _counter(stack, "gateway_migrations_total") > migrations


def test_beam_search_equals_transformers_num_beams(family_stack):
    stack, oracle = family_stack
    case = chat_case(INTRO, "Name three colours.")
    inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images)
    import torch

    with torch.inference_mode():
        rows = oracle.model.generate(input_ids=inputs.input_ids, num_beams=3, num_return_sequences=3, do_sample=False, max_new_tokens=6)
    expected = [row[len(inputs.token_ids) :].tolist() for row in rows]
    reply = client_for(stack).chat.completions.create(
        model=stack.served_model,
        messages=case.body["messages"],
        n=3,
        max_tokens=6,
        temperature=0,
        extra_body={"use_beam_search": True, "return_token_ids": True},
    )
    assert [c.model_extra["token_ids"] for c in reply.choices] == expected


def test_a_lora_adapter_on_the_language_model_and_tower_matches_transformers_with_it_merged(family_stack):
    stack, _ = family_stack
    case = chat_case(INTRO, _png(61), "What is in this picture?")
    expected = _oracle_text(stack.adapter_oracle, case)
    # Round robin: the repeat runs on other nodes, which may pull the adapter's own prefix (when
    # that beats recomputing it: Gemma3's usable prefix ends before the image, a few blocks).
    for sight in ("cold", "repeat"):
        reply = client_for(stack).chat.completions.create(model="t", messages=case.body["messages"], **GREEDY)
        assert reply.choices[0].message.content == expected, sight
