"""A node's metrics, each declared once: a typed object that carries its name, help and kind.

Why: a statistic written as an int here and as a name in a hand-kept dict there drifts (a count
exported under the wrong name, or not at all), and a histogram flattened into key names has to be
parsed back. So a node declares its metrics as the fields of one record (a dataclass, which may
nest the records of its parts), increments them where it counts, and ``snapshot`` reads the
records into one typed value: counters (cumulative), gauges, and histograms with their bucket
bounds. The Stats RPC carries that value in typed fields (services/transport/stats_wire.py), and
both /metrics renderers (a node's own, and the gateway's cluster view) render it, so the kind of a
series is never guessed from its name.

Names are the Prometheus names without the ``tessera_`` prefix. A counter's name ends ``_total``
and no other's does: prometheus_client writes a counter family without the suffix and puts it
back on the sample, so the series keeps the declared name.

A count kept by a part that knows nothing of metrics (the engine, a cache, the vision tower) is
read from it when a snapshot is taken (``read_from``), not copied into a second count.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

QUEUE_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

Reader = Callable[[], float]


class Counter:
    """Cumulative since the process started. Incremented from any thread, or read from the part
    that counts (``read_from``)."""

    __slots__ = ("name", "help", "_value", "_read", "_lock")

    def __init__(self, name: str, help: str) -> None:
        if not name.endswith("_total"):
            raise ValueError(f"a counter's name ends with _total: {name!r}")
        self.name, self.help = name, help
        self._value = 0.0
        self._read: Reader | None = None
        self._lock = threading.Lock()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0 or self._read is not None:
            raise ValueError(f"{self.name} only counts up, and only where it is not read from its owner")
        with self._lock:
            self._value += amount

    def read_from(self, read: Reader) -> None:
        self._read = read

    @property
    def value(self) -> float:
        return float(self._read()) if self._read is not None else self._value


class Gauge:
    """A value that goes up and down: set, or read at snapshot time (``read_from``)."""

    __slots__ = ("name", "help", "_value", "_read")

    def __init__(self, name: str, help: str) -> None:
        if name.endswith("_total"):
            raise ValueError(f"only a counter's name ends with _total: {name!r}")
        self.name, self.help = name, help
        self._value = 0.0
        self._read: Reader | None = None

    def set(self, value: float) -> None:
        self._value = float(value)

    def read_from(self, read: Reader) -> None:
        self._read = read

    @property
    def value(self) -> float:
        return float(self._read()) if self._read is not None else self._value


@dataclass(frozen=True, slots=True)
class HistogramValue:
    bounds: tuple[float, ...]  # finite upper bounds, ascending; the last bucket (+Inf) is implied
    cumulative: tuple[float, ...]  # observations <= each bound, then all of them
    sum: float

    def __post_init__(self) -> None:
        if len(self.cumulative) != len(self.bounds) + 1:
            raise ValueError(f"{len(self.bounds)} bounds need {len(self.bounds) + 1} cumulative counts, got {len(self.cumulative)}")

    @property
    def count(self) -> float:
        return self.cumulative[-1]

    def __add__(self, other: HistogramValue) -> HistogramValue:
        if other.bounds != self.bounds:
            raise ValueError("histograms with different bounds do not add up")
        return HistogramValue(self.bounds, tuple(a + b for a, b in zip(self.cumulative, other.cumulative)), self.sum + other.sum)

    def buckets(self) -> list[tuple[str, float]]:
        """(upper bound as Prometheus' ``le`` label, cumulative count), "+Inf" last."""
        return [(repr(bound), count) for bound, count in zip(self.bounds, self.cumulative)] + [("+Inf", self.count)]


class Histogram:
    __slots__ = ("name", "help", "bounds", "_counts", "_sum", "_lock")

    def __init__(self, name: str, help: str, bounds: Sequence[float] = QUEUE_BUCKETS_S) -> None:
        if name.endswith(("_total", "_sum", "_count", "_bucket")):
            raise ValueError(f"a histogram's series add _bucket, _sum and _count to its name: {name!r}")
        if not bounds or list(bounds) != sorted(set(bounds)) or not math.isfinite(bounds[-1]):
            raise ValueError("bounds must be a non-empty, strictly ascending sequence of finite numbers")
        self.name, self.help = name, help
        self.bounds = tuple(float(b) for b in bounds)
        self._counts = [0] * (len(self.bounds) + 1)  # per bucket, the last one above every bound
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self.bounds, value)  # the first bound >= value
        with self._lock:
            self._counts[index] += 1
            self._sum += value

    @property
    def value(self) -> HistogramValue:
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, running = [], 0
        for count in counts:
            running += count
            cumulative.append(float(running))
        return HistogramValue(self.bounds, tuple(cumulative), total)


Metric = Counter | Gauge | Histogram


def counter(name: str, help: str) -> Any:
    """A record's field holding a Counter of its own (one per record built)."""
    return field(default_factory=lambda: Counter(name, help))


def gauge(name: str, help: str) -> Any:
    return field(default_factory=lambda: Gauge(name, help))


def histogram(name: str, help: str, bounds: Sequence[float] = QUEUE_BUCKETS_S) -> Any:
    return field(default_factory=lambda: Histogram(name, help, bounds))


@dataclass(slots=True)
class Snapshot:
    """Every metric of some records at one moment, by name."""

    counters: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, HistogramValue] = field(default_factory=dict)
    help: dict[str, str] = field(default_factory=dict)  # for a node's own /metrics; Stats does not carry it

    def add(self, metric: Metric) -> None:
        """Take ``metric`` in; one of the same name and kind already here is summed with it (a
        process-wide part may live several times in one test process)."""
        if isinstance(metric, Histogram):
            kind, value = self.histograms, metric.value
        else:
            kind, value = (self.counters if isinstance(metric, Counter) else self.gauges), metric.value
        if any(metric.name in other for other in (self.counters, self.gauges, self.histograms) if other is not kind):
            raise ValueError(f"{metric.name} is declared as two kinds of metric")
        kind[metric.name] = kind[metric.name] + value if metric.name in kind else value
        self.help.setdefault(metric.name, metric.help)


def metrics_of(record: object) -> Iterator[Metric]:
    """The metrics of a record: its fields that are metrics, and those of its nested records
    (dataclasses, and mappings of them); a field that is None is a part the node does not have."""
    if isinstance(record, Counter | Gauge | Histogram):
        yield record
    elif is_dataclass(record) and not isinstance(record, type):
        for f in fields(record):
            yield from metrics_of(getattr(record, f.name))
    elif isinstance(record, Mapping):
        for value in record.values():
            yield from metrics_of(value)
    elif record is not None:
        raise TypeError(f"a metrics record holds metrics and records of them, not {type(record).__name__}")


def snapshot(*records: object) -> Snapshot:
    out = Snapshot()
    for record in records:
        for metric in metrics_of(record):
            out.add(metric)
    return out
