"""PrefillNode.run releases what it claimed when a step fails: a request whose images cannot all
be made resident leaves no reference on the embeddings it found here, so they stay evictable. It
fetches each image from its named holder, and counts the prompts it could compute now."""

from __future__ import annotations

import asyncio

import pytest
import torch

from services.engine.config import EngineConfig
from services.engine.engine import RequestRejectedError
from services.engine.remote_request import PromptItem
from services.prefill.local_pixels import MissingPixelsError
from services.prefill.node import PrefillNode
from services.preprocess.preprocessor import Preprocessor
from services.transport.tensor_channel import TensorInbox
from tests.factories import chat_case, encode_image, make_image
from tests.services.prefill.fakes import FakeUpstream, prefill_job, prompt_items, seeded_embeddings


@pytest.fixture(scope="module")
def held_and_new(tiny_model):
    """A node holding the first of two images, and a prompt with both."""
    node = PrefillNode(tiny_model, EngineConfig(), data_bind="tcp://127.0.0.1:0")
    sink = TensorInbox("tcp://127.0.0.1:0")  # stands in for a decode node's inbox
    held, new = (encode_image(make_image(112, 112, seed=s)) for s in (11, 12))
    preprocessor = Preprocessor(tiny_model)
    first = preprocessor.preprocess(chat_case(held, "What is it?").prompt)
    both = preprocessor.preprocess(chat_case(held, new, "Which differ?").prompt)
    items = prompt_items(both)
    upstream = FakeUpstream(node.engine.runner.checkpoint.text.hidden_size, lacks_pixels=frozenset({items[1].mm_hash}))
    asyncio.run(node.run(prefill_job("held", first, sink.address, max_tokens=1), upstream))
    yield node, both, items, sink, upstream
    upstream.close()
    sink.close()
    node.close()


def _users(node: PrefillNode, item: PromptItem) -> set[str]:
    return node.loop.call(lambda engine: set(engine.encoder_cache.mm_hash_to_requests.get(item.mm_hash, ()))).result()


def test_images_lacking_with_no_encoder_named_reject_the_request_and_release_the_held_one(held_and_new):
    node, both, items, sink, upstream = held_and_new
    with pytest.raises(RequestRejectedError, match="no encoder_address"):
        asyncio.run(node.run(prefill_job("no-encoder", both, sink.address, max_tokens=1, encoder_address=None), upstream))
    assert "no-encoder" not in _users(node, items[0])


def test_an_encoder_lacking_pixels_names_them_and_the_held_image_is_released(held_and_new):
    node, both, items, sink, upstream = held_and_new
    with pytest.raises(MissingPixelsError, match="encoder lacks pixels") as caught:
        asyncio.run(node.run(prefill_job("no-pixels", both, sink.address, max_tokens=1), upstream))
    assert caught.value.missing == [items[1].mm_hash]
    assert "no-pixels" not in _users(node, items[0])


def test_each_image_comes_from_its_named_holder_and_the_encoder_encodes_what_a_holder_lost(tiny_model):
    """A request's images held by two nodes: each asked of its holder, in prompt order; an image a
    holder no longer has, or a holder that fails outright, falls back to the route's encoder (no
    request fails)."""
    node = PrefillNode(tiny_model, EngineConfig(), data_bind="tcp://127.0.0.1:0")
    sink = TensorInbox("tcp://127.0.0.1:0")
    upstream = FakeUpstream(node.engine.runner.checkpoint.text.hidden_size)
    try:
        images = [encode_image(make_image(112, 112, seed=s)) for s in (21, 22, 23, 24)]
        preprocessor = Preprocessor(tiny_model)
        prep = preprocessor.preprocess(chat_case(*images[:2], "Which differ?").prompt)
        first, second = (i.mm_hash for i in prompt_items(prep))
        job = prefill_job("two-holders", prep, sink.address, max_tokens=1, image_to_source={second: "holder"})
        asyncio.run(node.run(job, upstream))
        assert upstream.encode_calls == [("encoder", [first]), ("holder", [second])]  # in prompt order

        upstream.encode_calls.clear()
        prep = preprocessor.preprocess(chat_case(*images[2:], "And these?").prompt)
        third, fourth = (i.mm_hash for i in prompt_items(prep))
        upstream.source_to_lacking, upstream.failing_sources = {"lost-it": frozenset({third})}, frozenset({"gone"})
        job = prefill_job("holders-fail", prep, sink.address, max_tokens=1, image_to_source={third: "lost-it", fourth: "gone"})
        asyncio.run(node.run(job, upstream))
        assert upstream.encode_calls == [("lost-it", [third]), ("encoder", [third]), ("gone", [fourth]), ("encoder", [fourth])]
    finally:
        upstream.close()
        sink.close()
        node.close()


def test_a_prefill_node_ships_the_embeddings_it_holds_and_names_the_rest(held_and_new):
    node, both, items, sink, upstream = held_and_new
    inbox = TensorInbox("tcp://127.0.0.1:0")
    try:
        held, new = items[0].mm_hash, items[1].mm_hash
        assert asyncio.run(node.ship_embeddings([held, new], inbox.address)) == [new]
        message = inbox.wait(held, 10)
        assert message is not None
        assert torch.equal(message.tensors["embeds"], seeded_embeddings(items[0], node.engine.runner.checkpoint.text.hidden_size))
    finally:
        inbox.close()


def test_a_prompt_counts_as_ready_from_its_embeddings_to_its_first_token(tiny_model):
    """What the node posts for a colocated decode node to yield to (shared/colocation/host_backlog.py): a
    prompt waiting on its encoder is not ready, one whose embeddings are resident is, until its
    first token; one that never gets its embeddings never counts."""
    posted: list[int] = []
    node = PrefillNode(tiny_model, EngineConfig(), data_bind="tcp://127.0.0.1:0", post_ready=posted.append)
    sink = TensorInbox("tcp://127.0.0.1:0")
    preprocessor = Preprocessor(tiny_model)
    prep = preprocessor.preprocess(chat_case(encode_image(make_image(112, 112, seed=31)), "What is it?").prompt)
    lacking = preprocessor.preprocess(chat_case(encode_image(make_image(112, 112, seed=32)), "And this?").prompt)
    lacks_pixels = frozenset({prompt_items(lacking)[0].mm_hash})
    upstream = FakeUpstream(node.engine.runner.checkpoint.text.hidden_size, lacks_pixels=lacks_pixels)
    try:
        asyncio.run(node.run(prefill_job("ready", prep, sink.address, max_tokens=1), upstream))
        assert posted == [1, 0] and node.num_ready == 0
        with pytest.raises(MissingPixelsError):
            asyncio.run(node.run(prefill_job("never-ready", lacking, sink.address, max_tokens=1), upstream))
        assert posted == [1, 0]
    finally:
        upstream.close()
        sink.close()
        node.close()
