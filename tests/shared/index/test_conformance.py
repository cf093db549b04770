"""One conformance suite, run against every index backend: in-process, embedded Valkey and
Debian's redis-server (conftest.py has the backends)."""

from __future__ import annotations

import pytest
import redis

from shared.index.backend import create_index
from shared.index.types import IndexEvents, IndexUnavailableError, MmEntry, NodeInfo, block_entry
from shared.types import BlockHash, MmHash

TTL = 0.5


def node(name: str, role: str = "prefill") -> NodeInfo:
    return NodeInfo(name, role, f"{name}.example:50061", f"tcp://{name}.example:50071")


ENTRY = MmEntry(num_tokens=64, grid_thw=(1, 16, 16), num_bytes=64 * 768 * 4)


def test_registration_starts_a_new_greater_epoch_each_time(index):
    first = index.register_node(node("a"), ttl_s=30)
    second = index.register_node(node("a"), ttl_s=30)
    other = index.register_node(node("b"), ttl_s=30)
    assert first < second and len({first, second, other}) == 3


def test_live_nodes_are_the_cluster_with_their_advertised_addresses(index):
    index.register_node(node("enc", "encoder"), ttl_s=30)
    index.register_node(node("pre", "preprocess"), ttl_s=30)
    live = index.live_nodes()
    assert set(live) == {"enc", "pre"}
    assert live["enc"].info == node("enc", "encoder") and live["pre"].info.role == "preprocess"


def test_a_prefill_node_that_encodes_says_so_in_its_record(index):
    encodes = NodeInfo("pf", "prefill", "pf.example:50061", "tcp://pf.example:50071", can_encode=True)
    index.register_node(encodes, ttl_s=30)
    index.register_node(node("plain"), ttl_s=30)
    live = index.live_nodes()
    assert live["pf"].info == encodes and not live["plain"].info.can_encode


def test_a_records_seal_is_stored_and_handed_back_as_given(index):
    epoch = index.register_node(node("sealed"), ttl_s=30, seal_fn=lambda e: f"seal-at-{e}")
    assert index.live_nodes()["sealed"].seal == f"seal-at-{epoch}"
    assert index.heartbeat("sealed", epoch, load=2.5, kv_usage=0.25, ttl_s=30, seal="beat")
    state = index.live_nodes()["sealed"]
    assert (state.seal, state.epoch, state.load, state.kv_usage) == ("beat", epoch, 2.5, 0.25)
    index.register_node(node("plain"), ttl_s=30)
    assert index.live_nodes()["plain"].seal == ""


def test_a_deregistered_node_and_its_entries_are_gone_at_once(index):
    epoch = index.register_node(node("draining"), ttl_s=30)
    index.publish("draining", epoch, blocks(0))
    index.deregister_node("draining", epoch)
    assert "draining" not in index.live_nodes()
    assert index.lookup([], [BlockHash("b0")]).node_to_num_prefix_blocks == {}
    assert not index.heartbeat("draining", epoch, load=0, kv_usage=0, ttl_s=30)


def test_a_stale_incarnation_cannot_deregister_its_successor(index):
    old = index.register_node(node("r"), ttl_s=30)
    new = index.register_node(node("r"), ttl_s=30)
    index.deregister_node("r", old)
    assert index.live_nodes()["r"].epoch == new


def test_lapsed_nodes_are_pruned_and_a_pruned_id_never_reuses_an_epoch(index, lapse):
    first = index.register_node(node("gone"), ttl_s=TTL)
    index.publish("gone", first, blocks(0))
    lapse(TTL + 0.3)
    assert "gone" not in index.live_nodes()  # pruned here
    again = index.register_node(node("gone"), ttl_s=30)
    assert again > first
    assert index.lookup([], [BlockHash("b0")]).node_to_num_prefix_blocks == {}  # old entries stay hidden


def test_published_entries_are_served_and_evictions_remove_them(index):
    epoch = index.register_node(node("enc-1", "encoder"), ttl_s=30)
    index.publish("enc-1", epoch, IndexEvents(mm_stored={MmHash("img"): ENTRY}, kv_stored={BlockHash("b0"): "device"}))
    result = index.lookup([MmHash("img"), MmHash("other")], [BlockHash("b0")])
    assert result.mm_holders[MmHash("img")] == {"enc-1": ENTRY}
    assert result.mm_holders[MmHash("other")] == {}
    assert result.node_to_num_prefix_blocks == {"enc-1": 1}
    assert result.node_to_epoch == {"enc-1": epoch}
    index.publish("enc-1", epoch, IndexEvents(mm_evicted=[MmHash("img")], kv_evicted=[BlockHash("b0")]))
    result = index.lookup([MmHash("img")], [BlockHash("b0")])
    assert result.mm_holders[MmHash("img")] == {} and result.node_to_num_prefix_blocks == {}


def blocks(*indices: int) -> IndexEvents:
    return IndexEvents(kv_stored={BlockHash(f"b{i}"): "device" for i in indices})


def test_each_nodes_prefix_ends_at_its_first_missing_block(index):
    ea = index.register_node(node("a"), ttl_s=30)
    eb = index.register_node(node("b"), ttl_s=30)
    ec = index.register_node(node("c", "decode"), ttl_s=30)
    index.publish("a", ea, blocks(0, 1, 2, 4))
    index.publish("b", eb, blocks(0, 2, 3))  # b's blocks after its gap at b1 do not count
    index.publish("c", ec, blocks(1, 2))  # no block 0: no prefix at all
    result = index.lookup([], [BlockHash(f"b{i}") for i in range(5)])
    assert result.node_to_num_prefix_blocks == {"a": 3, "b": 1}


def test_the_walk_stops_at_the_first_block_no_live_node_holds(index):
    ea = index.register_node(node("a"), ttl_s=30)
    eb = index.register_node(node("b"), ttl_s=30)
    index.publish("a", ea, blocks(0, 1, 3, 4))
    index.publish("b", eb, blocks(0, 1, 3))  # nobody holds b2
    assert index.lookup([], [BlockHash(f"b{i}") for i in range(5)]).node_to_num_prefix_blocks == {"a": 2, "b": 2}
    assert index.lookup([], [BlockHash("b2"), BlockHash("b3")]).node_to_num_prefix_blocks == {}
    assert index.lookup([], []).node_to_num_prefix_blocks == {}


def test_blocks_of_dead_or_stale_nodes_are_gaps_in_a_live_nodes_prefix(index, lapse):
    live = index.register_node(node("live"), ttl_s=30)
    dying = index.register_node(node("dying"), ttl_s=TTL)
    old = index.register_node(node("restarted"), ttl_s=30)
    index.publish("live", live, blocks(0, 2))
    index.publish("dying", dying, blocks(0, 1, 2))
    index.publish("restarted", old, blocks(0, 1, 2))
    new = index.register_node(node("restarted"), ttl_s=30)
    index.publish("restarted", new, blocks(0, 2))  # its old epoch's b1 must not count
    hashes = [BlockHash(f"b{i}") for i in range(3)]
    assert index.lookup([], hashes).node_to_num_prefix_blocks == {"live": 1, "dying": 3, "restarted": 1}
    lapse(TTL + 0.3)
    assert index.lookup([], hashes).node_to_num_prefix_blocks == {"live": 1, "restarted": 1}


def test_entries_of_a_dead_node_are_never_served(index, lapse):
    epoch = index.register_node(node("dying"), ttl_s=TTL)
    index.publish("dying", epoch, IndexEvents(kv_stored={BlockHash("x"): "device"}, mm_stored={MmHash("m"): ENTRY}))
    assert index.lookup([MmHash("m")], [BlockHash("x")]).node_to_num_prefix_blocks == {"dying": 1}
    lapse(TTL + 0.3)
    result = index.lookup([MmHash("m")], [BlockHash("x")])
    assert result.node_to_num_prefix_blocks == {} and result.mm_holders[MmHash("m")] == {} and "dying" not in result.node_to_epoch


def test_heartbeat_keeps_a_node_alive_and_reports_load(index, lapse):
    epoch = index.register_node(node("busy"), ttl_s=TTL)
    for _ in range(3):
        lapse(TTL / 2)
        assert index.heartbeat("busy", epoch, load=3.0, kv_usage=0.25, ttl_s=TTL)
    state = index.live_nodes()["busy"]
    assert state.load == 3.0 and state.kv_usage == 0.25


def test_a_lapsed_node_cannot_heartbeat_back_to_life(index, lapse):
    """Once its TTL lapsed, a node must register again (a new epoch): reviving it would serve
    entries its heartbeat gap may have made stale."""
    epoch = index.register_node(node("late"), ttl_s=TTL)
    index.publish("late", epoch, IndexEvents(kv_stored={BlockHash("k"): "device"}))
    lapse(TTL + 0.3)
    assert not index.heartbeat("late", epoch, load=1.0, kv_usage=0.0, ttl_s=30)
    result = index.lookup([], [BlockHash("k")])
    assert "late" not in result.node_to_epoch and result.node_to_num_prefix_blocks == {}


def test_a_restarted_node_does_not_serve_entries_of_its_old_epoch(index):
    old = index.register_node(node("r"), ttl_s=30)
    index.publish("r", old, IndexEvents(kv_stored={BlockHash("k"): "device"}))
    new = index.register_node(node("r"), ttl_s=30)
    assert new > old
    assert index.lookup([], [BlockHash("k")]).node_to_num_prefix_blocks == {}
    assert not index.heartbeat("r", old, load=0, kv_usage=0, ttl_s=30)  # the old incarnation is fenced off
    index.publish("r", new, IndexEvents(kv_stored={BlockHash("k"): "device"}))
    assert index.lookup([], [BlockHash("k")]).node_to_num_prefix_blocks == {"r": 1}


def test_a_lookup_names_only_the_holders_and_reports_the_membership_version(index, lapse):
    held = index.register_node(node("holder"), ttl_s=30)
    index.register_node(node("idle"), ttl_s=30)
    index.publish("holder", held, IndexEvents(mm_stored={MmHash("m"): ENTRY}))
    result = index.lookup([MmHash("m")], [])
    assert result.node_to_epoch == {"holder": held}
    assert index.lookup([], []).node_to_epoch == {}
    version = result.membership_version
    index.register_node(node("joiner"), ttl_s=TTL)
    assert index.lookup([], []).membership_version > version, "a registration moves the version"
    version = index.lookup([], []).membership_version
    index.heartbeat("holder", held, load=1.0, kv_usage=0.0, ttl_s=30)
    assert index.lookup([], []).membership_version == version, "heartbeats do not"
    lapse(TTL + 0.3)
    index.live_nodes()  # prunes the lapsed joiner
    assert index.lookup([], []).membership_version > version, "a prune moves it"
    version = index.lookup([], []).membership_version
    index.deregister_node("holder", held)
    assert index.lookup([], []).membership_version > version, "a drain moves it"


def test_lookup_is_one_round_trip(index_url, index):
    epoch = index.register_node(node("a"), ttl_s=30)
    index.publish("a", epoch, IndexEvents(kv_stored={BlockHash(f"b{i}"): "device" for i in range(64)}))
    hashes = [BlockHash(f"b{i}") for i in range(64)]
    if index_url == "memory://":
        before = index.num_round_trips
        index.lookup([MmHash("m1"), MmHash("m2")], hashes)
        assert index.num_round_trips == before + 1
        return
    client = redis.Redis.from_url(index_url)
    index.lookup([], [])  # loads the script
    client.config_resetstat()
    index.lookup([MmHash("m1"), MmHash("m2")], hashes)
    stats = {k: v["calls"] for k, v in client.info("commandstats").items() if not k.startswith(("cmdstat_config", "cmdstat_info"))}
    # One client command; HLEN, HGETALL, HMGET, HGET and GET run inside the script on the server.
    assert stats.pop("cmdstat_evalsha") == 1, stats
    assert set(stats) <= {"cmdstat_hlen", "cmdstat_hgetall", "cmdstat_hmget", "cmdstat_hget", "cmdstat_get"}, stats
    assert stats["cmdstat_hget"] == 1, "one field of the one holder's record, not the record"


def test_a_lookup_reads_the_same_whatever_the_number_of_nodes(index_url, index):
    """O(images + blocks + holders), not O(nodes): 200 more idle nodes change nothing it reads."""
    if index_url == "memory://":
        pytest.skip("counts the server's commands")
    epoch = index.register_node(node("a"), ttl_s=30)
    index.publish("a", epoch, IndexEvents(mm_stored={MmHash("m"): ENTRY}, kv_stored={BlockHash(f"b{i}"): "device" for i in range(8)}))
    client = redis.Redis.from_url(index_url)
    hashes = [BlockHash(f"b{i}") for i in range(8)]

    def commands() -> dict[str, int]:
        client.config_resetstat()
        index.lookup([MmHash("m")], hashes)
        return {k: v["calls"] for k, v in client.info("commandstats").items() if not k.startswith(("cmdstat_config", "cmdstat_info"))}

    index.lookup([], [])  # loads the script
    few = commands()
    for i in range(200):
        index.register_node(node(f"idle-{i}"), ttl_s=30)
    assert commands() == few
    # The one holder's epoch field, one entry hash (its length, then its entries) per image and
    # block 0, one HMGET per further block.
    expected = {"cmdstat_evalsha": 1, "cmdstat_hlen": 2, "cmdstat_hget": 1, "cmdstat_hgetall": 2, "cmdstat_hmget": 7}
    assert few == expected | {"cmdstat_get": 1}, few


def test_a_heartbeat_fails_once_someone_else_rewrote_the_record(index, index_url):
    """A record rewritten under the node (an old copy put back) makes its next heartbeat fail, so
    the node registers afresh instead of re-sealing fields it never wrote."""
    if index_url == "memory://":
        pytest.skip("only a server's records can be written by someone else")
    epoch = index.register_node(node("victim"), ttl_s=30)
    client = redis.Redis.from_url(index_url, decode_responses=True)
    client.hset(index.inner.prefix + "node:victim", "epoch", epoch - 1)  # inner: the RedisIndex behind the breaker
    assert not index.heartbeat("victim", epoch, load=0, kv_usage=0, ttl_s=30)
    assert index.register_node(node("victim"), ttl_s=30) > epoch


def test_unreachable_index_raises_a_typed_error_and_then_fails_fast():
    from services.stack.node_process import free_port

    index = create_index(f"redis://127.0.0.1:{free_port()}/0", namespace="down")
    for _ in range(3):
        with pytest.raises(IndexUnavailableError):
            index.lookup([], [])
    # Its circuit breaker is open now: calls fail without touching the network.
    with pytest.raises(IndexUnavailableError, match="skipped"):
        index.register_node(node("x"), ttl_s=1)
    assert index.breaker.state == "open"


def test_unknown_index_url_is_rejected():
    with pytest.raises(ValueError, match="unsupported index URL"):
        create_index("mongodb://x", namespace="n")


def hybrid_blocks(num_blocks: int, *, states_at: set[int]) -> IndexEvents:
    """A hybrid model's node holding blocks 0..num_blocks-1, with the state kept after ``states_at``."""
    return IndexEvents(kv_stored={BlockHash(f"b{i}"): block_entry("device", resumable=i in states_at) for i in range(num_blocks)})


def test_a_hybrid_nodes_prefix_ends_at_its_last_kept_state(index):
    eh = index.register_node(node("hybrid"), ttl_s=30)
    ef = index.register_node(node("full"), ttl_s=30)
    en = index.register_node(node("stateless"), ttl_s=30)
    index.publish("hybrid", eh, hybrid_blocks(6, states_at={1, 3}))
    index.publish("full", ef, blocks(0, 1, 2, 3, 4))
    index.publish("stateless", en, hybrid_blocks(5, states_at=set()))  # KV only: nowhere to resume
    hashes = [BlockHash(f"b{i}") for i in range(6)]
    assert index.lookup([], hashes).node_to_num_prefix_blocks == {"hybrid": 4, "full": 5}
    assert index.lookup([], hashes[:3]).node_to_num_prefix_blocks == {"hybrid": 2, "full": 3}
    assert index.lookup([], hashes[:1]).node_to_num_prefix_blocks == {"full": 1}


def test_a_state_saved_or_dropped_later_moves_a_hybrid_nodes_prefix(index):
    epoch = index.register_node(node("hybrid"), ttl_s=30)
    index.publish("hybrid", epoch, hybrid_blocks(4, states_at={1}))
    hashes = [BlockHash(f"b{i}") for i in range(4)]
    assert index.lookup([], hashes).node_to_num_prefix_blocks == {"hybrid": 2}
    index.publish("hybrid", epoch, IndexEvents(kv_stored={BlockHash("b3"): block_entry("device", resumable=True)}))
    assert index.lookup([], hashes).node_to_num_prefix_blocks == {"hybrid": 4}
    index.publish("hybrid", epoch, IndexEvents(kv_stored={BlockHash("b3"): block_entry("device", resumable=False)}))
    index.publish("hybrid", epoch, IndexEvents(kv_evicted=[BlockHash("b0")]))  # the head evicted: nothing left
    assert index.lookup([], hashes).node_to_num_prefix_blocks == {}
