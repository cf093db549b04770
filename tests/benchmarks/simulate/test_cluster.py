"""Modelled nodes: bounded LRU caches whose changes reach the index as a real node's would, and
kills and drains as real nodes do them."""

from __future__ import annotations

from benchmarks.simulate.cluster import Capacities, Cluster, Lru
from shared.index.backend import create_index


def test_lru_reports_what_it_stored_and_evicted():
    lru = Lru(3)
    assert lru.add(["a", "b", "c"]) == (["a", "b", "c"], [])
    assert lru.add(["a", "d"]) == (["d"], ["b"])  # a was touched, so b was the least recent
    assert lru.leading(["a", "c", "b", "d"]) == 2 and len(lru) == 3


def test_a_nodes_cache_changes_are_published_and_a_drain_withdraws_them():
    index = create_index("memory://", namespace="sim-cluster")
    cluster = Cluster(index, Capacities(kv_blocks=2, images=1))
    prefill = cluster.add("prefill")
    assert prefill.info.can_encode and prefill.address in cluster.nodes
    cluster.store(prefill, blocks=["b0", "b1", "b2"], images=["img1", "img2"])  # b0 and img1 evicted at once
    found = index.lookup(["img1", "img2"], ["b1", "b2"])
    assert found.node_to_num_prefix_blocks == {prefill.info.node_id: 2}
    assert found.mm_holders == {"img1": {}, "img2": {prefill.info.node_id: found.mm_holders["img2"][prefill.info.node_id]}}
    assert cluster.num_kv_entries == 2 and cluster.num_mm_entries == 1
    cluster.drain(prefill)
    assert index.lookup(["img2"], ["b1"]).node_to_num_prefix_blocks == {} and prefill.state == "draining"
    assert cluster.num_kv_entries == 0 and cluster.retire(prefill) and prefill.state == "dead"


def test_a_killed_node_leaves_the_membership_and_its_entries_are_no_longer_served():
    index = create_index("memory://", namespace="sim-kill")
    cluster = Cluster(index)
    decode = cluster.add("decode")
    cluster.store(decode, blocks=["b0"])
    cluster.kill(decode)
    assert decode.info.node_id not in index.live_nodes()
    assert index.lookup([], ["b0"]).node_to_num_prefix_blocks == {}
    assert cluster.num_kv_entries == 1  # still stored in the index, unserved, until its key expires
