"""The prefill node's cache gauges: KV blocks held by requests, blocks holding cached prefix KV
(both against the pool), and embedding rows against the embedding cache's budget."""

from __future__ import annotations

import asyncio

from services.engine.config import EngineConfig
from services.prefill.node import PrefillNode
from services.preprocess.preprocessor import Preprocessor
from services.transport.tensor_channel import TensorInbox
from shared.cache_gauges import cache_usage
from shared.node_metrics import snapshot
from tests.factories import chat_case, encode_image, make_image
from tests.services.prefill.fakes import FakeUpstream, prefill_job

BLOCK = 16


def test_gauges_after_a_prefill(tiny_model):
    node = PrefillNode(
        tiny_model,
        EngineConfig(block_size=BLOCK, num_kv_blocks=64, encoder_cache_tokens=512, max_encoder_tokens_per_step=512),
        data_bind="tcp://127.0.0.1:0",
    )
    sink = TensorInbox("tcp://127.0.0.1:0")  # stands in for a decode node's inbox
    upstream = _upstream(node)
    try:
        assert _usage(node) == {"kv": (0.0, 64.0), "prefix": (0.0, 64.0), "embedding": (0.0, 512.0)}
        prep = Preprocessor(tiny_model).preprocess(chat_case(encode_image(make_image(112, 112, seed=5)), "What is it?").prompt)
        asyncio.run(node.run(prefill_job("r1", prep, sink.address, max_tokens=4), upstream))
        # Finished: no block is held, its full blocks stay cached, its embeddings stay resident.
        assert _usage(node) == {
            "kv": (0.0, 64.0),
            "prefix": (float(len(prep.prompt_token_ids) // BLOCK), 64.0),
            "embedding": (float(prep.mm_items[0].placeholder.length), 512.0),
        }
    finally:
        upstream.close()
        sink.close()
        node.close()


def _usage(node: PrefillNode) -> dict[str, tuple[float, float]]:
    # Read on the engine thread, after any step in flight, so the counts are settled.
    gauges = node.loop.call(lambda engine: snapshot(node.metrics).gauges).result()
    # The tensor inbox's gauge (bytes waiting to be claimed) is tested with the inbox itself.
    return {u.cache: (u.used, u.capacity) for u in cache_usage(gauges) if u.cache != "tensor_inbox"}


def _upstream(node: PrefillNode) -> FakeUpstream:
    return FakeUpstream(node.engine.runner.checkpoint.text.hidden_size)


def test_hit_miss_and_eviction_counters(tiny_model):
    """Embeddings count in images, prefix lookups in prompt tokens; an image a prefix hit covers
    is not looked up; a second image evicts the first from an embedding cache that holds one, and its prompt's blocks evict cached ones from
    a pool that holds one prompt."""
    preprocessor = Preprocessor(tiny_model)
    preps = [preprocessor.preprocess(chat_case(encode_image(make_image(112, 112, seed=s)), "What is it?").prompt) for s in (5, 6)]
    num_rows = preps[0].mm_items[0].placeholder.length
    num_blocks = -(-len(preps[0].prompt_token_ids) // BLOCK)
    config = EngineConfig(
        block_size=BLOCK, num_kv_blocks=num_blocks + 1, encoder_cache_tokens=num_rows, max_encoder_tokens_per_step=num_rows
    )
    node = PrefillNode(tiny_model, config, data_bind="tcp://127.0.0.1:0")
    sink = TensorInbox("tcp://127.0.0.1:0")
    upstream = _upstream(node)
    try:
        for request_id, prep in (("a1", preps[0]), ("a2", preps[0]), ("b1", preps[1])):
            asyncio.run(node.run(prefill_job(request_id, prep, sink.address, max_tokens=1), upstream))
        counters = node.loop.call(lambda engine: snapshot(node.metrics).counters).result()
        # a2's prefix hit covers its image: its embeddings are not even looked up.
        assert [counters[f"embedding_cache_{kind}_total"] for kind in ("hits", "misses", "evictions")] == [0.0, 2.0, 1.0]
        num_prompt_tokens = len(preps[0].prompt_token_ids)
        cached = (num_prompt_tokens - 1) // BLOCK * BLOCK  # a2 reuses a1's full blocks (the last token is always computed)
        assert counters["prefix_cache_hits_total"] == cached
        assert counters["prefix_cache_misses_total"] == 2 * num_prompt_tokens + len(preps[1].prompt_token_ids) - cached
        assert counters["prefix_cache_evictions_total"] >= 1
    finally:
        upstream.close()
        sink.close()
        node.close()
