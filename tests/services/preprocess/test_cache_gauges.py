"""The preprocess node's cache gauges: processor cache (bytes), encoded-file memo and pixel
mirror (entries), each used against its budget, and every budget kept while images churn."""

from __future__ import annotations

from services.preprocess.config import PreprocessConfig
from services.preprocess.node import PreprocessNode
from services.transport.tensor_channel import TensorInbox
from shared.cache_gauges import cache_usage
from shared.node_metrics import snapshot
from tests.factories import chat_case, encode_image, make_image


def test_gauges_follow_the_caches_and_stay_within_budget(tiny_model):
    config = PreprocessConfig(processor_cache_bytes=200_000, file_hash_memo_entries=3)
    node = PreprocessNode(tiny_model, config, mirror_entries=2)
    inbox = TensorInbox("tcp://127.0.0.1:0")
    try:
        assert {u.cache: (u.used, u.capacity) for u in cache_usage(snapshot(node.metrics).gauges)} == {
            "processor": (0.0, 200_000.0),
            "file_hash_memo": (0.0, 3.0),
            "pixel_mirror": (0.0, 0.0),  # a mirror per encoder fed; none yet
        }
        for seed in range(5):
            [item] = node.preprocess(chat_case(encode_image(make_image(56, 56, seed=seed)), "What is it?").prompt).mm_items
            node.push_pixels([item.mm_hash], target_id="e", target_address=inbox.address, force=False)
            usage = {u.cache: u for u in cache_usage(snapshot(node.metrics).gauges)}
            assert all(u.used <= u.capacity for u in usage.values())
        cache = node.preprocessor.processor_cache
        assert usage["processor"].used == cache.stats.num_bytes > 0
        assert usage["processor"].used + cache.stats.num_bytes / len(cache) > cache.capacity_bytes  # full: it evicts
        assert usage["file_hash_memo"].used == 3  # 5 distinct files, 3 remembered
        assert (usage["pixel_mirror"].used, usage["pixel_mirror"].capacity) == (2, 2)  # one encoder fed
    finally:
        inbox.close()
        node.close()


def test_only_encoders_fed_get_a_mirror_and_their_number_is_bounded(tiny_model, monkeypatch):
    monkeypatch.setattr("services.preprocess.node.MAX_MIRRORS", 2)
    node = PreprocessNode(tiny_model, PreprocessConfig(), mirror_entries=4)
    inbox = TensorInbox("tcp://127.0.0.1:0")
    try:
        [item] = node.preprocess(chat_case(encode_image(make_image(56, 56, seed=0)), "What is it?").prompt).mm_items
        assert node._encoder_to_mirror == {}  # preprocessing sends nothing: the gateway routes first
        node.push_pixels([item.mm_hash], target_id="p", target_address=inbox.address, key_prefix="px/1/")
        assert node._encoder_to_mirror == {}  # a prefill node encoding locally keeps no pixels
        for encoder_id in ("a", "b", "a", "c"):  # c joins: b, the least recently used, goes
            node.push_pixels([item.mm_hash], target_id=encoder_id, target_address=inbox.address, force=False)
        assert list(node._encoder_to_mirror) == ["a", "c"]
    finally:
        inbox.close()
        node.close()
