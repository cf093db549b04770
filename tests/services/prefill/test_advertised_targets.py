"""A prefill node bound to a wildcard (as in a container) names its advertised data address, never
its bound one, as the target of everything it asks peers to push it: an encoder's embeddings, and
a peer's prefix KV pages. (On one host a wildcard still reaches the right node, so only the
address itself can show the bug this guards against; tests/deploy/test_netns_hosts.py shows it
across hosts.)"""

from __future__ import annotations

import asyncio

import pytest

from services.engine.config import EngineConfig
from services.prefill.kv_pull import KVSource
from services.prefill.node import PrefillNode
from services.preprocess.preprocessor import Preprocessor
from services.transport.tensor_channel import TensorInbox
from tests.factories import chat_case, encode_image, make_image
from tests.services.prefill.fakes import FakeUpstream, prefill_job


@pytest.fixture(scope="module")
def nodes(tiny_model):
    config = EngineConfig(block_size=16)
    source = PrefillNode(tiny_model, config, data_bind="tcp://127.0.0.1:0")
    puller = PrefillNode(tiny_model, config, data_bind="tcp://0.0.0.0:0", advertise_host="127.0.0.1", kv_pull_timeout_s=5.0)
    sink = TensorInbox("tcp://127.0.0.1:0")  # stands in for a decode node's inbox
    upstream = FakeUpstream(source.engine.runner.checkpoint.text.hidden_size, peers={"source": source})
    yield source, puller, sink, upstream
    upstream.close()
    for closeable in (source, puller, sink):
        closeable.close()


def test_encode_and_kv_pull_targets_are_the_advertised_address(nodes, tiny_model):
    source, puller, sink, upstream = nodes
    assert puller.inbox.bound_address.is_wildcard
    assert puller.data_address == f"tcp://127.0.0.1:{puller.inbox.bound_address.port}"
    prep = Preprocessor(tiny_model).preprocess(chat_case(encode_image(make_image(224, 224, seed=5)), "What is this?").prompt)
    asyncio.run(source.run(prefill_job("cold", prep, sink.address), upstream))
    num_before = len(upstream.targets)

    job = prefill_job("pulled", prep, sink.address, kv_sources=[KVSource("source", num_tokens=len(prep.prompt_token_ids))])
    result = asyncio.run(puller.run(job, upstream))
    assert result.num_pulled_tokens > 0  # the peer pushed its pages to the address it was given
    assert upstream.targets[num_before:] == [puller.data_address, puller.data_address]  # the encode call, then the pull
