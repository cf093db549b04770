"""Images encoded where the request lands: a stack whose gateway sends every image the encoder
lacks to the prefill node's own vision tower (``--encode-dispatch prefill``, the end state of
the adaptive rule when the encoder tier is queued). Answers equal the oracle token for token,
the encoder encodes nothing, and a repeated image is a hit in the prefill node's cache. For each
model family (Qwen2-VL's tiny, Gemma3's tiny)."""

from __future__ import annotations

import pytest

from tests.factories import chat_case
from tests.services.stack.conftest import launch_stack, stop_stack
from tests.services.stack.e2e_helpers import GREEDY, client_for, oracle_text, png


@pytest.fixture(scope="module", params=["tiny", "gemma3-tiny"])
def local_stack(request, tmp_path_factory, repo_root):
    running = launch_stack(tmp_path_factory.mktemp("local-encode"), repo_root, "--model", request.param, "--encode-dispatch", "prefill")
    running.served_model = request.param
    yield running
    stop_stack(running)


def _oracle_for(stack, request):
    if stack.served_model == "tiny":
        return request.getfixturevalue("oracle")
    from services.models.registry import resolve_model
    from tests.oracle import ReferenceOracle

    return ReferenceOracle(resolve_model(stack.served_model, progress=lambda _m: None).path)


def test_images_encoded_on_the_prefill_node_equal_the_oracle(local_stack, request):
    oracle = _oracle_for(local_stack, request)
    client = client_for(local_stack)
    first = chat_case(png(96, 64, seed=31), "Describe the picture.")
    second = chat_case(png(64, 96, seed=32), "What colour dominates?", png(96, 64, seed=31), "Compare them.")
    for case in (first, second, first):
        reply = client.chat.completions.create(model=local_stack.served_model, messages=case.body["messages"], **GREEDY)
        expected, num_prompt_tokens = oracle_text(oracle, case)
        assert reply.choices[0].message.content == expected
        assert reply.usage.prompt_tokens == num_prompt_tokens
    metrics = local_stack.metrics()
    assert metrics["tessera_gateway_local_encode_routes_total"] >= 2
    # Two distinct images, each encoded once, both on the prefill node: the repeats were hits
    # in its embedding cache.
    assert metrics["tessera_prefill_images_encoded_locally_total"] == 2
    assert metrics["tessera_encoder_items_encoded_total"] == 0
