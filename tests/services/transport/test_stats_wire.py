"""A node's metrics snapshot through the Stats reply and back: each kind in its own field."""

from __future__ import annotations

from protos.gen import pb
from services.transport.stats_wire import snapshot_of, stats_response
from shared.node_metrics import HistogramValue, Snapshot


def test_counters_gauges_and_histograms_keep_their_kind_on_the_wire():
    sent = Snapshot(
        {"decode_requests_total": 3.0},
        {"kv_cache_used_blocks": 7.0},
        {"queue_seconds": HistogramValue((0.1, 1.0), (1.0, 2.0, 4.0), 9.5)},
        help={"decode_requests_total": "not carried"},
    )
    reply = pb.StatsResponse.FromString(stats_response("decode", sent, "tcp://d:1").SerializeToString())
    assert (reply.role, reply.data_address, reply.pid > 0) == ("decode", "tcp://d:1", True)
    assert snapshot_of(reply) == Snapshot(sent.counters, sent.gauges, sent.histograms)


def test_a_histogram_whose_counts_do_not_match_its_bounds_is_left_out():
    reply = pb.StatsResponse(
        role="prefill",
        counters={"x_total": 1.0},
        histograms=[pb.Histogram(name="queue_seconds", bounds=[0.1, 1.0], cumulative_counts=[1.0], sum=0.05)],
    )
    assert snapshot_of(reply) == Snapshot({"x_total": 1.0})
