"""Cache occupancy as node metrics: every bounded cache a node holds reports what it uses and its
budget, in the cache's own unit, as a pair of gauges declared together (``cache_gauges``)

    <cache>_cache_used_<unit>      <cache>_cache_capacity_<unit>

(on a node's /metrics ``tessera_<cache>_cache_used_<unit>{role=...}``). The names are flat, not
labelled, because the gateway's /metrics sums each name over the live nodes: the sums are then the
cluster's occupancy and budget. ``cache_usage`` reads the pairs back from a Stats reply's gauges
(the soak benchmark, dashboards).

Every cache also counts its lookups, ``<cache>_cache_hits_total`` and ``<cache>_cache_misses_total``,
and, where it evicts, ``<cache>_cache_evictions_total``, declared with the node's other counters:
in the cache's lookup unit (images for the processor, encoder and embedding caches, prompt tokens
for the prefix cache, as vLLM counts its prefix-cache queries and hits; evictions in the cache's
entries). Hit rate = hits / (hits + misses).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.node_metrics import Gauge, Reader

UNITS = ("bytes", "entries", "rows", "blocks")
_USED = re.compile(rf"^(?P<cache>[a-z0-9_]+)_cache_used_(?P<unit>{'|'.join(UNITS)})$")


@dataclass(slots=True)
class CacheGauges:
    used: Gauge
    capacity: Gauge

    def read_from(self, used: Reader, capacity: Reader) -> None:
        self.used.read_from(used)
        self.capacity.read_from(capacity)


def cache_gauges(cache: str, unit: str) -> Any:
    """A metrics record's field: the used and capacity gauges of one cache, read once bound with
    ``read_from``."""
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
    return field(
        default_factory=lambda: CacheGauges(
            Gauge(f"{cache}_cache_used_{unit}", f"The {cache} cache's {unit} in use"),
            Gauge(f"{cache}_cache_capacity_{unit}", f"The {cache} cache's budget in {unit}"),
        )
    )


@dataclass(frozen=True, slots=True)
class CacheUsage:
    cache: str
    unit: str
    used: float
    capacity: float

    @property
    def fraction(self) -> float:
        """Used / budget; 0 for a cache with no budget (disabled)."""
        return self.used / self.capacity if self.capacity > 0 else 0.0


def cache_usage(gauges: Mapping[str, float]) -> list[CacheUsage]:
    """Every cache whose used and capacity gauges are both in ``gauges``, by name."""
    out = []
    for name, used in gauges.items():
        match = _USED.match(name)
        if match is None:
            continue
        capacity = gauges.get(f"{match['cache']}_cache_capacity_{match['unit']}")
        if capacity is not None:
            out.append(CacheUsage(match["cache"], match["unit"], float(used), float(capacity)))
    return sorted(out, key=lambda usage: usage.cache)
