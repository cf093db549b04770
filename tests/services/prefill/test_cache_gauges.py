"""The prefill node's cache gauges: KV blocks held by requests, blocks holding cached prefix KV
(both against the pool), and embedding rows against the embedding cache's budget."""

from __future__ import annotations

from services.engine import connector
from services.engine.config import EngineConfig
from services.engine.remote_request import PromptItem, build_request
from services.engine.sampling import SamplingParams
from services.prefill.node import PrefillNode
from services.preprocess import Preprocessor
from services.transport.tensor_channel import TensorInbox
from shared.cache_gauges import cache_usage
from tests.factories import chat_case, encode_image, make_image

BLOCK = 16


def test_gauges_after_a_prefill(tiny_model):
    node = PrefillNode(
        tiny_model,
        EngineConfig(block_size=BLOCK, num_kv_blocks=64, encoder_cache_tokens=512, max_encoder_tokens_per_step=512),
        data_bind="tcp://127.0.0.1:0",
    )
    sink = TensorInbox("tcp://127.0.0.1:0")  # stands in for a decode node's inbox
    try:
        assert _usage(node) == {"kv": (0.0, 64.0), "prefix": (0.0, 64.0), "embedding": (0.0, 512.0)}
        prep = Preprocessor(tiny_model).preprocess(chat_case(encode_image(make_image(112, 112, seed=5)), "What is it?").body)
        items = [PromptItem(i.mm_hash, i.placeholder, i.image.grid_thw) for i in prep.mm_items]
        request = build_request("r1", list(prep.prompt_token_ids), items, SamplingParams(max_tokens=4), None, node.merge_size)
        item = prep.mm_items[0]
        embeds = _embeddings(node, item.placeholder.length)
        node.loop.call(lambda engine: connector.import_embeddings(engine, "r1", item.mm_hash, embeds)).result()
        node.prefill(request, sink.address)
        # Finished: no block is held, its full blocks stay cached, its embeddings stay resident.
        assert _usage(node) == {
            "kv": (0.0, 64.0),
            "prefix": (float(request.num_prompt_tokens // BLOCK), 64.0),
            "embedding": (float(item.placeholder.length), 512.0),
        }
    finally:
        sink.close()
        node.close()


def _usage(node: PrefillNode) -> dict[str, tuple[float, float]]:
    # Read on the engine thread, after any step in flight, so the counts are settled.
    counters = node.loop.call(lambda engine: node.counters()).result()
    # The tensor inbox's gauge (bytes waiting to be claimed) is tested with the inbox itself.
    return {u.cache: (u.used, u.capacity) for u in cache_usage(counters) if u.cache != "tensor_inbox"}


def _embeddings(node: PrefillNode, num_rows: int):
    import torch

    return torch.randn(num_rows, node.engine.runner.checkpoint.text.hidden_size, generator=torch.Generator().manual_seed(0))
