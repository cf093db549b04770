"""The decode node exports the engine node's cache gauges: KV pool, prefix blocks, embeddings, and
its tensor inbox's bytes held."""

from __future__ import annotations

from services.decode.node import DecodeNode
from services.engine.config import EngineConfig
from shared.cache_gauges import cache_usage
from shared.node_metrics import snapshot


def test_an_idle_decode_node_reports_its_budgets_and_nothing_used(tiny_model):
    node = DecodeNode(
        tiny_model, EngineConfig(num_kv_blocks=32, encoder_cache_tokens=256, max_encoder_tokens_per_step=256), data_bind="tcp://127.0.0.1:0"
    )
    try:
        usage = {u.cache: (u.unit, u.used, u.capacity) for u in cache_usage(snapshot(node.metrics).gauges)}
        assert usage == {
            "kv": ("blocks", 0.0, 32.0),
            "prefix": ("blocks", 0.0, 32.0),
            "embedding": ("rows", 0.0, 256.0),
            "tensor_inbox": ("bytes", 0.0, float(node.inbox.capacity_bytes)),
        }
    finally:
        node.close()
