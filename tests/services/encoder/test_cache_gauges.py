"""The encoder node's cache gauge: embedding rows held against the row budget, through churn."""

from __future__ import annotations

import asyncio

from services.encoder.node import EncodeItem, EncoderNode
from services.preprocess.config import PreprocessConfig
from services.preprocess.node import PreprocessNode
from services.transport.tensor_channel import TensorInbox
from shared.cache_gauges import cache_usage
from shared.node_metrics import snapshot
from tests.factories import chat_case, encode_image, make_image


def test_rows_held_follow_the_cache_and_stay_within_budget(tiny_model):
    encoder = EncoderNode(tiny_model, data_bind="tcp://127.0.0.1:0", cache_tokens=10)
    preprocess = PreprocessNode(tiny_model, PreprocessConfig())
    sink = TensorInbox("tcp://127.0.0.1:0")  # stands in for a prefill node's inbox
    try:
        assert [(u.cache, u.unit, u.used, u.capacity) for u in cache_usage(snapshot(encoder.metrics).gauges)] == [
            ("encoder", "rows", 0.0, 10.0),
            ("tensor_inbox", "bytes", 0.0, float(encoder.inbox.capacity_bytes)),  # pixels waiting to be encoded
        ]
        for seed in range(4):  # 56x56: 4 rows each, so at most 2 fit
            prompt = chat_case(encode_image(make_image(56, 56, seed=seed)), "What is it?").prompt
            item = preprocess.preprocess(prompt).mm_items[0]
            preprocess.push_pixels([item.mm_hash], target_id="e", target_address=encoder.data_address, force=False)
            asyncio.run(encoder.encode([EncodeItem(item.mm_hash, item.placeholder.length, item.image.grid_thw)], sink.address))
            (usage,) = [u for u in cache_usage(snapshot(encoder.metrics).gauges) if u.cache == "encoder"]
            assert usage.used <= usage.capacity
        assert usage.used == 8 == sum(e.shape[0] for e in encoder.store.values())
    finally:
        sink.close()
        preprocess.close()
        encoder.close()
