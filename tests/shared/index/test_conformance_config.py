"""Config agreement (shared/index/cluster_config.py), run against every index backend
(conftest.py): the first registrant fixes the cluster's settings, a node that disagrees is refused
and never served, and the record lives only as long as the cluster does."""

from __future__ import annotations

import asyncio

import pytest
import redis

from services.router.membership import Membership
from shared.index.backend import create_index
from shared.index.cluster_config import ClusterConfig, ConfigMismatchError, Disagreement
from shared.index.reader import LocalReader
from shared.index.types import IndexEvents, NodeInfo
from shared.types import BlockHash

TTL = 0.5
PAGES = ClusterConfig(block_size=16, dtype="float32")


def node(name: str, config: ClusterConfig, role: str = "prefill") -> NodeInfo:
    return NodeInfo(name, role, f"{name}.example:50061", f"tcp://{name}.example:50071", config=config)


def test_a_node_whose_block_size_disagrees_is_refused_and_writes_nothing(index):
    index.register_node(node("first", PAGES), ttl_s=30)
    version = index.lookup([], []).membership_version
    with pytest.raises(ConfigMismatchError) as refused:
        index.register_node(node("odd", ClusterConfig(block_size=32, dtype="float32")), ttl_s=30)
    assert refused.value.disagreements == [Disagreement("block_size", "32", "16")]
    assert "odd" in str(refused.value) and "its block_size is 32, the cluster's is 16" in str(refused.value)
    assert set(index.live_nodes()) == {"first"}
    assert index.lookup([], []).membership_version == version
    index.register_node(node("same", PAGES), ttl_s=30)  # agreeing nodes still join
    assert set(index.live_nodes()) == {"first", "same"}


def test_every_disagreeing_setting_is_named(index):
    index.register_node(node("first", PAGES), ttl_s=30)
    with pytest.raises(ConfigMismatchError) as refused:
        index.register_node(node("odd", ClusterConfig(block_size=8, dtype="bfloat16")), ttl_s=30)
    assert refused.value.disagreements == [Disagreement("block_size", "8", "16"), Disagreement("dtype", "bfloat16", "float32")]


def test_a_node_gives_only_the_settings_that_matter_to_it(index):
    """An encoder keeps no KV pages: it joins whatever the block size, and does not fix it."""
    index.register_node(node("enc", ClusterConfig(dtype="float32"), "encoder"), ttl_s=30)
    index.register_node(node("pre", ClusterConfig(), "preprocess"), ttl_s=30)
    index.register_node(node("pf", PAGES), ttl_s=30)  # the first to give a block size fixes it
    with pytest.raises(ConfigMismatchError, match="block_size is 32"):
        index.register_node(node("dec", ClusterConfig(block_size=32, dtype="float32"), "decode"), ttl_s=30)
    with pytest.raises(ConfigMismatchError, match="dtype is bfloat16"):
        index.register_node(node("enc2", ClusterConfig(dtype="bfloat16"), "encoder"), ttl_s=30)
    assert set(index.live_nodes()) == {"enc", "pre", "pf"}


def test_records_hand_back_the_settings_they_registered_with(index):
    index.register_node(node("pf", PAGES), ttl_s=30)
    assert index.live_nodes()["pf"].info.config == PAGES


def test_the_record_lapses_once_no_node_of_the_cluster_is_alive(index, lapse):
    """A redeploy with a new block size, after the old cluster stopped, is not wedged."""
    index.register_node(node("old", PAGES), ttl_s=TTL)
    lapse(TTL + 0.3)
    index.register_node(node("new", ClusterConfig(block_size=32, dtype="float32")), ttl_s=30)
    with pytest.raises(ConfigMismatchError, match="the cluster's is 32"):
        index.register_node(node("old", PAGES), ttl_s=30)


def test_heartbeats_keep_the_record_alive_past_its_first_ttl(index, lapse):
    epoch = index.register_node(node("a", PAGES), ttl_s=TTL)
    for _ in range(4):
        lapse(TTL / 2)
        assert index.heartbeat("a", epoch, load=0, kv_usage=0, ttl_s=TTL)
    with pytest.raises(ConfigMismatchError):
        index.register_node(node("odd", ClusterConfig(block_size=32)), ttl_s=TTL)


def test_the_record_outlives_the_longest_lived_node(index, lapse):
    index.register_node(node("long", PAGES), ttl_s=30)
    index.register_node(node("short", PAGES), ttl_s=TTL)  # a shorter TTL does not shorten the record
    lapse(TTL + 0.3)
    with pytest.raises(ConfigMismatchError):
        index.register_node(node("odd", ClusterConfig(block_size=32)), ttl_s=30)


def test_a_sealed_index_refuses_the_same_way(index_url):
    sealed = create_index(index_url, namespace="sealed-config", record_key=b"k" * 16)
    try:
        sealed.register_node(node("a", PAGES), ttl_s=30)
        with pytest.raises(ConfigMismatchError):
            sealed.register_node(node("b", ClusterConfig(block_size=32)), ttl_s=30)
        assert set(sealed.live_nodes()) == {"a"}
        if index_url != "memory://":  # a refusal is an answer: the circuit breaker stays closed
            assert sealed.breaker.state == "closed"
    finally:
        sealed.close()


def test_a_node_record_disagreeing_with_the_cluster_is_never_served(index, index_url):
    """A record that got past registration (an older build, one put back by hand) is neither a
    member nor credited with cached work."""
    if index_url == "memory://":
        pytest.skip("only a server's records can be written by someone else")
    index.register_node(node("good", PAGES), ttl_s=30)
    epoch = index.register_node(node("sneaky", PAGES), ttl_s=30)
    index.publish("sneaky", epoch, IndexEvents(kv_stored={BlockHash("b0"): "device"}))
    client = redis.Redis.from_url(index_url, decode_responses=True)
    client.hset(index.inner.prefix + "node:sneaky", "cfg:block_size", "32")  # inner: the RedisIndex behind the breaker
    assert set(index.live_nodes()) == {"good"}
    membership = Membership(LocalReader(index))
    asyncio.run(membership.refresh())
    named = index.lookup([], [BlockHash("b0")]).node_to_epoch  # a lookup names holders; the membership says whom to credit
    assert membership.resolve(named) == {}
