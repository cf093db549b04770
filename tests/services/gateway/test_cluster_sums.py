"""Cluster sums that never decrease (pure logic)."""

from __future__ import annotations

from services.gateway.cluster_sums import RETIRED, ClusterSums, is_cumulative


def test_which_statistics_are_cumulative():
    assert is_cumulative("decode_requests_total") and is_cumulative("queue_seconds_bucket_le_0.1")
    assert is_cumulative("queue_seconds_sum") and is_cumulative("queue_seconds_count")
    assert not is_cumulative("kv_cache_used_blocks") and not is_cumulative("decode_kv_blocks_free")


def test_departed_nodes_keep_their_counts_and_are_retired_into_one_total_per_role():
    now = [0.0]
    sums = ClusterSums(forget_after_s=10.0, clock=lambda: now[0])
    sums.update({"decode@a": {"x_total": 5.0, "gauge": 1.0}, "decode@b": {"x_total": 7.0, "gauge": 2.0}})
    now[0] = 5.0
    reported = sums.update({"decode@a": {"x_total": 6.0, "gauge": 1.0}})
    assert reported == {"decode@a": {"x_total": 6.0, "gauge": 1.0}, "decode@b": {"x_total": 7.0}}  # b's gauge goes with it
    now[0] = 20.0
    reported = sums.update({"decode@a": {"x_total": 6.0, "gauge": 1.0}})
    assert reported == {"decode@a": {"x_total": 6.0, "gauge": 1.0}, f"decode@{RETIRED}": {"x_total": 7.0}}


def test_a_restarted_node_adds_to_what_it_had_counted():
    sums = ClusterSums()
    sums.update({"prefill@a": {"x_total": 40.0}})
    assert sums.update({"prefill@a": {"x_total": 2.0}}) == {"prefill@a": {"x_total": 42.0}}
    assert sums.update({"prefill@a": {"x_total": 5.0}}) == {"prefill@a": {"x_total": 45.0}}
