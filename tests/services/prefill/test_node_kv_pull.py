"""Prefix KV pulled between two real prefill nodes over their ZMQ data planes: the puller adopts
the pages as a prefix hit with the same first token; a pull whose pages never arrive falls back
to recomputing, with the same first token."""

from __future__ import annotations

import functools

import pytest

from services.engine import connector
from services.engine.config import EngineConfig
from services.engine.remote_request import PromptItem, build_request
from services.engine.sampling_params import SamplingParams
from services.prefill.kv_pull import KVSource
from services.prefill.node import PrefillNode
from services.preprocess import Preprocessor
from services.transport.tensor_channel import TensorInbox
from tests.factories import chat_case, encode_image, make_image

BLOCK = 16


@pytest.fixture(scope="module")
def nodes(tiny_model):
    config = EngineConfig(block_size=BLOCK)
    made = [PrefillNode(tiny_model, config, data_bind="tcp://127.0.0.1:0", kv_pull_timeout_s=2.0) for _ in range(2)]
    sink = TensorInbox("tcp://127.0.0.1:0")  # stands in for a decode node's inbox
    yield made, sink
    for node in made:
        node.close()
    sink.close()


@functools.cache
def _preprocessor(model) -> Preprocessor:
    return Preprocessor(model)


def _request(tiny_model, node: PrefillNode, request_id: str, seed: int):
    case = chat_case(encode_image(make_image(224, 224, seed=seed)), "What is in the picture?")
    prep = _preprocessor(tiny_model).preprocess(case.body)
    items = [PromptItem(i.mm_hash, i.placeholder, i.image.grid_thw) for i in prep.mm_items]
    request = build_request(request_id, list(prep.prompt_token_ids), items, SamplingParams(max_tokens=4), None, node.positions)
    return request, prep


def _prefill(node: PrefillNode, request, prep, sink: TensorInbox):
    for item in prep.mm_items:  # embeddings as an encoder would push them
        embeds = _embeddings(node, item)
        node.loop.call(lambda engine, i=item, e=embeds: connector.import_embeddings(engine, request.request_id, i.mm_hash, e)).result()
    return node.prefill(request, sink.address)


def _embeddings(node, item):
    import torch

    generator = torch.Generator().manual_seed(int(item.mm_hash[:8], 16))
    hidden = node.engine.runner.checkpoint.text.hidden_size
    return torch.randn(item.placeholder.length, hidden, generator=generator)


def test_pulled_prefix_is_adopted_and_gives_the_same_first_token(nodes, tiny_model):
    (source, puller), sink = nodes
    request, prep = _request(tiny_model, source, "a1", seed=77)
    expected = _prefill(source, request, prep, sink)
    pulled_before = puller.counters()["prefill_kv_blocks_pulled_total"]
    exported_before = source.counters()["kv_blocks_exported_total"]

    again, _ = _request(tiny_model, puller, "b1", seed=77)
    plan = puller.plan_pull(again, [KVSource("source", num_tokens=len(request.block_hashes) * BLOCK)])
    assert plan is not None and len(plan.hashes) == (again.num_prompt_tokens - 1) // BLOCK
    sent = source.export_kv(plan.hashes, puller.data_address, plan.transfer_id)
    assert sent == len(plan.hashes)
    assert puller.receive_kv(plan, sent) == sent
    result = _prefill(puller, again, prep, sink)
    assert result.num_cached_tokens == sent * BLOCK
    assert result.first_token_id == expected.first_token_id
    assert puller.counters()["prefill_kv_blocks_pulled_total"] - pulled_before == sent
    assert source.counters()["kv_blocks_exported_total"] - exported_before == sent


def test_a_pull_that_never_arrives_falls_back_to_recomputing(nodes, tiny_model):
    (source, puller), sink = nodes
    request, prep = _request(tiny_model, source, "a2", seed=78)
    expected = _prefill(source, request, prep, sink)
    failures_before = puller.counters()["prefill_kv_pull_failures_total"]

    again, _ = _request(tiny_model, puller, "b2", seed=78)
    plan = puller.plan_pull(again, [KVSource("gone", num_tokens=10 * BLOCK)])
    assert plan is not None
    assert puller.receive_kv(plan, num_blocks=len(plan.hashes)) == 0  # nothing was sent: times out
    result = _prefill(puller, again, prep, sink)
    assert result.num_cached_tokens == 0
    assert result.first_token_id == expected.first_token_id
    assert puller.counters()["prefill_kv_pull_failures_total"] - failures_before == 1


def test_no_pull_when_the_peer_holds_no_more_than_we_do(nodes, tiny_model):
    (_, puller), _ = nodes
    request, _ = _request(tiny_model, puller, "a3", seed=79)
    assert puller.plan_pull(request, [KVSource("peer", num_tokens=0)]) is None
    assert puller.plan_pull(request, [KVSource("peer", num_tokens=BLOCK - 1)]) is None
