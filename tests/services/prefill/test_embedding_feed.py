"""A request whose images and video groups together exceed the prefill node's embedding cache
runs window by window (services/prefill/embedding_feed.py): its first token equals, and every KV
page it ships matches (up to the rounding of other chunk boundaries), those of a node whose
cache holds the whole clip, the encoder is asked a window at a
time, and two such requests side by side both finish; a clip the node encodes itself comes the
same way (one item larger than the cache is refused: tests/services/prefill/test_server.py)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
import torch

from services.engine.config import EngineConfig
from services.prefill.job import PrefillResult
from services.prefill.node import PrefillNode
from services.preprocess.preprocessor import Preprocessor
from services.transport.tensor_channel import TensorInbox, TensorSender
from tests.factories import Video, chat_case, make_clip
from tests.services.prefill.fakes import FakeUpstream, prefill_job, prompt_items

NUM_FRAMES = 24  # 12 temporal groups at the default 2 fps over 6 seconds


@pytest.fixture(scope="module")
def clips(tiny_model):
    preprocessor = Preprocessor(tiny_model)
    return [preprocessor.preprocess(chat_case(Video(make_clip(NUM_FRAMES, fps=4, seed=seed)), "What happens?").prompt) for seed in (41, 42)]


@pytest.fixture(scope="module")
def nodes(tiny_model, clips):
    """A node whose cache holds every group of a clip, and one that holds two at a time."""
    rows = max(item.placeholder.length for item in prompt_items(clips[0]))
    assert len(prompt_items(clips[0])) >= 6
    roomy = PrefillNode(tiny_model, EngineConfig(max_num_batched_tokens=32), data_bind="tcp://127.0.0.1:0")
    small_cache = EngineConfig(max_num_batched_tokens=32, encoder_cache_tokens=2 * rows, max_encoder_tokens_per_step=2 * rows)
    tight = PrefillNode(tiny_model, small_cache, data_bind="tcp://127.0.0.1:0")
    sink = TensorInbox("tcp://127.0.0.1:0")  # stands in for a decode node's inbox
    upstream = FakeUpstream(roomy.engine.runner.checkpoint.text.hidden_size)
    yield roomy, tight, sink, upstream
    upstream.close()
    sink.close()
    roomy.close()
    tight.close()


def _prefill(
    node: PrefillNode, request_id: str, prep, sink: TensorInbox, upstream: FakeUpstream
) -> tuple[PrefillResult, list[torch.Tensor]]:
    result = asyncio.run(node.run(prefill_job(request_id, prep, sink.address, max_tokens=1), upstream))
    message = sink.wait(request_id, 30)
    assert message is not None
    return result, [message.tensors[name] for name in sorted(message.tensors)]


def test_a_clip_larger_than_the_cache_prefills_window_by_window_exactly_as_one_that_fits(nodes, clips):
    roomy, tight, sink, upstream = nodes
    items = prompt_items(clips[0])
    capacity = tight.engine.encoder_cache.cache_size
    assert sum(i.placeholder.length for i in items) > 2 * capacity
    expected, expected_pages = _prefill(roomy, "roomy-0", clips[0], sink, upstream)

    num_calls = len(upstream.encode_calls)
    windows = tight.metrics.embeddings.num_windows_while_running.value
    result, pages = _prefill(tight, "tight-0", clips[0], sink, upstream)

    assert result == expected
    # The same KV up to float rounding: the engine's chunks now end where a window does.
    assert len(pages) == len(expected_pages) and all(torch.allclose(a, b, rtol=0, atol=1e-4) for a, b in zip(pages, expected_pages))
    calls = upstream.encode_calls[num_calls:]
    assert len(calls) >= len(items) // 2  # a window (two groups) at a time
    row_of = {i.mm_hash: i.placeholder.length for i in items}
    assert all(sum(row_of[h] for h in hashes) <= capacity for _, hashes in calls)
    assert tight.metrics.embeddings.num_windows_while_running.value > windows
    held = tight.loop.call(lambda engine: dict(engine.encoder_cache.mm_hash_to_requests)).result()
    assert not any(users for users in held.values())  # nothing left referenced


def test_two_clips_larger_than_the_cache_side_by_side_both_finish_exactly(nodes, clips):
    roomy, tight, sink, upstream = nodes
    expected = [_prefill(roomy, f"roomy-pair-{k}", clip, sink, upstream)[0] for k, clip in enumerate(clips)]

    async def both() -> list[PrefillResult]:
        runs = (tight.run(prefill_job(f"tight-pair-{k}", clip, sink.address, max_tokens=1), upstream) for k, clip in enumerate(clips))
        return list(await asyncio.wait_for(asyncio.gather(*runs), 120))

    assert asyncio.run(both()) == expected


def test_a_clip_this_node_encodes_itself_comes_window_by_window_its_pixels_taken_once(tiny_model, clips):
    """Adaptive dispatch chose this node's own tower for every group: the pixels pushed up front
    are taken as first needed and held for the later windows, each group encoded once, and the
    first token equals that of a node whose cache holds the whole clip."""
    prep = clips[1]
    items = prompt_items(prep)
    rows = max(i.placeholder.length for i in items)
    tight = EngineConfig(max_num_batched_tokens=32, encoder_cache_tokens=2 * rows, max_encoder_tokens_per_step=2 * rows)
    nodes = [
        PrefillNode(tiny_model, config, data_bind="tcp://127.0.0.1:0", local_encode=True)
        for config in (EngineConfig(max_num_batched_tokens=32), tight)
    ]
    sink, sender = TensorInbox("tcp://127.0.0.1:0"), TensorSender()
    try:
        results = []
        for k, node in enumerate(nodes):
            prefix = f"attempt-{k}/"
            for item in prep.mm_items:
                sender.send(node.data_address, prefix + item.mm_hash, {"pixel_values": item.image.pixel_values})
            job = replace(
                prefill_job(f"local-{k}", prep, sink.address, max_tokens=1, encoder_address=None),
                local_encode=frozenset(i.mm_hash for i in items),
                local_pixels_key_prefix=prefix,
            )
            results.append(asyncio.run(node.run(job, FakeUpstream())))
        assert results[1].first_token_id == results[0].first_token_id
        metrics = nodes[1].metrics.embeddings
        assert metrics.num_local_encodes.value == len(items) and metrics.num_windows_while_running.value > 0
    finally:
        sender.close()
        sink.close()
        for node in nodes:
            node.close()
