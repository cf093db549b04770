"""Gemma3 with ``--pan-and-scan`` on a real stack: a checkpoint in gemma-3-4b-it's Hub layout
(tests/hub_layouts.py), images wide and tall enough to be cropped, every crop its own span whose
pixels reach an encoder. Exact against transformers with ``do_pan_and_scan=True`` cold, on the
processor- and encoder-cache hits a round-robin 2/2/2 stack makes (each repeat lands on the other
nodes, the third back on the first), streamed too, and for greyscale, palette and RGBA images."""

from __future__ import annotations

import pytest

from tests.factories import chat_case, encode_image, make_image
from tests.hub_layouts import write_layout
from tests.oracle import ReferenceOracle
from tests.services.stack.conftest import launch_stack, stop_stack
from tests.services.stack.e2e_helpers import client_for

MAX_TOKENS = 10
GREEDY = {"temperature": 0, "max_tokens": MAX_TOKENS, "extra_body": {"ignore_eos": True}}


def _png(width, height, seed, mode="RGB"):
    return encode_image(make_image(width, height, seed=seed, mode=mode))


@pytest.fixture(scope="module")
def gemma3_hub_dir(tmp_path_factory):
    return write_layout("gemma-3-4b-it", tmp_path_factory.mktemp("gemma3_hub") / "gemma-3-4b-it")


def _serve(tmp_path, repo_root, model_dir, num_per_role: int):
    counts = [f"--{role}={num_per_role}" for role in ("preprocess", "encoders", "prefill", "decode")]
    running = launch_stack(tmp_path, repo_root, "--model", str(model_dir), "--pan-and-scan", *counts, "--routing-policy", "round_robin")
    running.served_model = model_dir.name
    return running


def _oracle_text(oracle: ReferenceOracle, case) -> str:
    inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images)
    return oracle.tokenizer.decode(oracle.generate(inputs, MAX_TOKENS).token_ids, skip_special_tokens=True)


def _ask(stack, case, *, stream: bool = False) -> tuple[str, int]:
    """(reply text, prompt tokens served from the prefix cache)."""
    client = client_for(stack)
    if not stream:
        reply = client.chat.completions.create(model=stack.served_model, messages=case.body["messages"], **GREEDY)
        return reply.choices[0].message.content, reply.usage.prompt_tokens_details.cached_tokens
    options = {"stream_options": {"include_usage": True}}
    chunks = list(
        client.chat.completions.create(model=stack.served_model, messages=case.body["messages"], stream=True, **options, **GREEDY)
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    return text, chunks[-1].usage.prompt_tokens_details.cached_tokens


def _check_crops_are_exact(stack, oracle) -> None:
    hits_before = stack.metrics().get("tessera_processor_cache_hits_total", 0.0)
    wide = chat_case(_png(900, 300, 1), "What is in this image?")
    cached = []
    for sight in range(3):  # cold, then on the other nodes, then back on the first nodes (cache hits)
        text, num_cached = _ask(stack, wide, stream=sight == 1)
        assert text == _oracle_text(oracle, wide), f"sight {sight}"
        cached.append(num_cached)
    assert cached[0] == 0 and cached[2] > 0, cached  # the third sight reuses the first's crops' KV
    mixed = chat_case(_png(280, 840, 2, "L"), "and", _png(96, 64, 3, "P"), "and", _png(720, 240, 4, "RGBA"), "compare them.")
    for sight in range(2):
        assert _ask(stack, mixed)[0] == _oracle_text(oracle, mixed), f"mixed, sight {sight}"
    assert stack.metrics().get("tessera_processor_cache_hits_total", 0.0) > hits_before


def test_pan_and_scan_crops_are_exact_on_2_2_2(gemma3_hub_dir, repo_root, tmp_path):
    stack = _serve(tmp_path, repo_root, gemma3_hub_dir, 2)
    try:
        _check_crops_are_exact(stack, ReferenceOracle(gemma3_hub_dir, do_pan_and_scan=True))
    finally:
        stop_stack(stack)


def test_pan_and_scan_crops_are_exact_on_1_1_1(gemma3_hub_dir, repo_root, tmp_path):
    stack = _serve(tmp_path, repo_root, gemma3_hub_dir, 1)
    try:
        _check_crops_are_exact(stack, ReferenceOracle(gemma3_hub_dir, do_pan_and_scan=True))
    finally:
        stop_stack(stack)
