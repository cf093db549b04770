"""A node's metrics snapshot (shared/node_metrics.py) on the Stats RPC, and read back, with each
metric's kind in its own field: counters, gauges, and histograms with their bounds."""

from __future__ import annotations

import logging
import os

from protos.gen import pb
from services.transport.addresses import AdvertisedAddress
from shared.node_metrics import HistogramValue, Snapshot

log = logging.getLogger("tessera")


def stats_response(role: str, snapshot: Snapshot, data_address: AdvertisedAddress | None = None) -> pb.StatsResponse:
    """``data_address``: where peers push this node tensors (None: it has no inbox)."""
    histograms = [
        pb.Histogram(name=name, bounds=h.bounds, cumulative_counts=h.cumulative, sum=h.sum) for name, h in snapshot.histograms.items()
    ]
    return pb.StatsResponse(
        role=role,
        pid=os.getpid(),
        counters=snapshot.counters,
        gauges=snapshot.gauges,
        histograms=histograms,
        data_address=data_address or "",
    )


def snapshot_of(response: pb.StatsResponse) -> Snapshot:
    """The metrics a node reported. A histogram whose counts do not match its bounds (a node that
    does not follow this format) is left out, so one bad series does not fail the scrape."""
    histograms = {}
    for h in response.histograms:
        try:
            histograms[h.name] = HistogramValue(tuple(h.bounds), tuple(h.cumulative_counts), h.sum)
        except ValueError as exc:
            log.warning("ignoring histogram %s from a %s node: %s", h.name, response.role, exc)
    return Snapshot(dict(response.counters), dict(response.gauges), histograms)
