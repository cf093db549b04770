"""Latency histograms carried in a node's flat Stats map (name -> value), and read back as
Prometheus histograms.

A node's statistics travel as one flat map (the Stats RPC, and each node's own /metrics), so a
histogram ``h`` is flattened to its cumulative bucket counts, sum and count:

    h_bucket_le_<bound> (one per bound, and le_inf)   h_sum   h_count

Bucket counts of equal bounds add up across nodes, so the gateway's cluster view sums them per
role, as it sums counters. ``histogram_samples`` splits such keys out of a Stats map.

Queue time (``queue_seconds``) is each role's wait before it starts on a request: for preprocess
the wait for its one working thread, for the encoder the wait for its compute thread, and for
prefill and decode the time from the request reaching the engine to its first scheduled step.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

QUEUE_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_BUCKET = re.compile(r"^(?P<name>[a-z0-9_]+)_bucket_le_(?P<le>inf|[0-9.e+-]+)$")


class FlatHistogram:
    def __init__(self, name: str, bounds: Sequence[float] = QUEUE_BUCKETS_S) -> None:
        if list(bounds) != sorted(bounds) or not bounds:
            raise ValueError("bounds must be a non-empty ascending sequence")
        self.name = name
        self.bounds = tuple(float(b) for b in bounds)
        self._counts = [0] * (len(self.bounds) + 1)  # per bucket, the last one above every bound
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        index = next((i for i, bound in enumerate(self.bounds) if value <= bound), len(self.bounds))
        with self._lock:
            self._counts[index] += 1
            self._sum += value

    def counters(self) -> dict[str, float]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        out, cumulative = {}, 0
        for bound, count in zip((*self.bounds, math.inf), counts):
            cumulative += count
            out[f"{self.name}_bucket_le_{_le(bound)}"] = float(cumulative)
        out[f"{self.name}_sum"] = total
        out[f"{self.name}_count"] = float(cumulative)
        return out


@dataclass(slots=True)
class HistogramSample:
    """One flattened histogram read back: cumulative counts by upper bound ("+Inf" last), and sum."""

    buckets: dict[str, float] = field(default_factory=dict)
    sum: float = 0.0

    def add(self, other: HistogramSample) -> None:
        for le, count in other.buckets.items():
            self.buckets[le] = self.buckets.get(le, 0.0) + count
        self.sum += other.sum

    def sorted_buckets(self) -> list[tuple[str, float]]:
        return sorted(self.buckets.items(), key=lambda item: float(item[0]))


def histogram_samples(counters: Mapping[str, float]) -> tuple[dict[str, HistogramSample], dict[str, float]]:
    """(histograms by name, the other statistics) of a flat Stats map."""
    samples: dict[str, HistogramSample] = {}
    for key, value in counters.items():
        match = _BUCKET.match(key)
        if match:
            le = "+Inf" if match["le"] == "inf" else match["le"]
            samples.setdefault(match["name"], HistogramSample()).buckets[le] = value
    histogram_keys = set()
    for name, sample in samples.items():
        sample.sum = counters.get(f"{name}_sum", 0.0)
        histogram_keys.update({f"{name}_sum", f"{name}_count"})
    rest = {k: v for k, v in counters.items() if k not in histogram_keys and not _BUCKET.match(k)}
    return samples, rest


def _le(bound: float) -> str:
    return "inf" if math.isinf(bound) else repr(bound)
