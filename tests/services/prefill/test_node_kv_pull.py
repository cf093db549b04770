"""Prefix KV pulled between two real prefill nodes over their ZMQ data planes, through
PrefillNode.run: the puller adopts the pages as a prefix hit with the same first token; a pull
whose pages never arrive, or whose peer cannot be asked, falls back to recomputing, with the same
first token; a peer holding no more than the puller is not asked."""

from __future__ import annotations

import asyncio
import functools

import pytest

from services.engine.config import EngineConfig
from services.prefill.job import PrefillJob, PrefillResult
from services.prefill.kv_pull import KVSource
from services.prefill.node import PrefillNode
from services.preprocess.preprocessor import Preprocessor
from services.transport.tensor_channel import TensorInbox
from tests.factories import chat_case, encode_image, make_image
from tests.services.prefill.fakes import FakeUpstream, prefill_job

BLOCK = 16


@pytest.fixture(scope="module")
def nodes(tiny_model):
    config = EngineConfig(block_size=BLOCK)
    made = [PrefillNode(tiny_model, config, data_bind="tcp://127.0.0.1:0", kv_pull_timeout_s=2.0) for _ in range(2)]
    sink = TensorInbox("tcp://127.0.0.1:0")  # stands in for a decode node's inbox
    hidden_size = made[0].engine.runner.checkpoint.text.hidden_size
    upstream = FakeUpstream(hidden_size, peers={"source": made[0]}, silent_peers=frozenset({"silent"}))
    yield made, sink, upstream
    upstream.close()
    for node in made:
        node.close()
    sink.close()


@functools.cache
def _preprocessor(model) -> Preprocessor:
    return Preprocessor(model)


def _job(tiny_model, sink: TensorInbox, request_id: str, seed: int, sources: list[KVSource] | None = None) -> PrefillJob:
    case = chat_case(encode_image(make_image(224, 224, seed=seed)), "What is in the picture?")
    return prefill_job(request_id, _preprocessor(tiny_model).preprocess(case.prompt), sink.address, kv_sources=sources or [])


def _run(node: PrefillNode, job: PrefillJob, upstream: FakeUpstream) -> PrefillResult:
    return asyncio.run(node.run(job, upstream))


def test_pulled_prefix_is_adopted_and_gives_the_same_first_token(nodes, tiny_model):
    (source, puller), sink, upstream = nodes
    job = _job(tiny_model, sink, "a1", seed=77)
    expected = _run(source, job, upstream)
    pulled, exported = puller.metrics.pulls.num_blocks_pulled, source.metrics.engine.num_kv_blocks_exported
    pulled_before, exported_before = pulled.value, exported.value

    again = _job(tiny_model, sink, "b1", seed=77, sources=[KVSource("source", num_tokens=len(job.prompt_token_ids))])
    result = _run(puller, again, upstream)
    sent = (len(job.prompt_token_ids) - 1) // BLOCK  # never the block of the last prompt token
    assert result.num_pulled_tokens == result.num_cached_tokens == sent * BLOCK
    assert result.first_token_id == expected.first_token_id
    assert pulled.value - pulled_before == sent
    assert exported.value - exported_before == sent


@pytest.mark.parametrize("peer", ["silent", "gone"])
def test_a_pull_that_fails_falls_back_to_recomputing(nodes, tiny_model, peer):
    (source, puller), sink, upstream = nodes
    seed = {"silent": 78, "gone": 80}[peer]
    expected = _run(source, _job(tiny_model, sink, f"a-{peer}", seed=seed), upstream)
    failures = puller.metrics.pulls.num_failures
    failures_before = failures.value

    result = _run(puller, _job(tiny_model, sink, f"b-{peer}", seed=seed, sources=[KVSource(peer, num_tokens=10 * BLOCK)]), upstream)
    assert result.num_pulled_tokens == result.num_cached_tokens == 0
    assert result.first_token_id == expected.first_token_id
    assert failures.value - failures_before == 1


def test_no_pull_when_the_peer_holds_no_more_than_we_do(nodes, tiny_model):
    (_, puller), sink, upstream = nodes
    calls_before = upstream.num_export_calls
    sources = [KVSource("source", num_tokens=0), KVSource("source", num_tokens=BLOCK - 1)]
    result = _run(puller, _job(tiny_model, sink, "a3", seed=79, sources=sources), upstream)
    assert result.num_pulled_tokens == 0
    assert upstream.num_export_calls == calls_before
