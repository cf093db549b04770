"""Cache occupancy as node statistics: every bounded cache a node holds reports what it uses and
its budget, in the cache's own unit, as two gauges

    <cache>_cache_used_<unit>      <cache>_cache_capacity_<unit>

(on a node's /metrics ``tessera_<cache>_cache_used_<unit>{role=...}``). The names are flat, not
labelled, because a node's Stats map is flat (name -> value) and the gateway's /metrics sums each
name over the live nodes: the sums are then the cluster's occupancy and budget. ``cache_usage``
reads the pairs back from a Stats map (the soak benchmark, dashboards).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

UNITS = ("bytes", "entries", "rows", "blocks")
_USED = re.compile(rf"^(?P<cache>[a-z0-9_]+)_cache_used_(?P<unit>{'|'.join(UNITS)})$")


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


def cache_counters(cache: str, *, hits: float, misses: float, evictions: float | None = None) -> dict[str, float]:
    """Lookups that hit and missed, and entries evicted, since the node started, as

        <cache>_cache_hits_total   <cache>_cache_misses_total   <cache>_cache_evictions_total

    in the cache's lookup unit (images for the processor, encoder and embedding caches, prompt
    tokens for the prefix cache, as vLLM counts its prefix-cache queries and hits; evictions in
    the cache's entries; None: reported elsewhere, or nothing to evict). Hit rate = hits /
    (hits + misses)."""
    counters = {f"{cache}_cache_hits_total": float(hits), f"{cache}_cache_misses_total": float(misses)}
    if evictions is not None:
        counters[f"{cache}_cache_evictions_total"] = float(evictions)
    return counters


def cache_gauges(cache: str, unit: str, used: float, capacity: float) -> dict[str, float]:
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
    return {f"{cache}_cache_used_{unit}": float(used), f"{cache}_cache_capacity_{unit}": float(capacity)}


def cache_usage(stats: Mapping[str, float]) -> list[CacheUsage]:
    """Every cache whose used and capacity gauges are both in ``stats``, by name."""
    out = []
    for name, used in stats.items():
        match = _USED.match(name)
        if match is None:
            continue
        capacity = stats.get(f"{match['cache']}_cache_capacity_{match['unit']}")
        if capacity is not None:
            out.append(CacheUsage(match["cache"], match["unit"], float(used), float(capacity)))
    return sorted(out, key=lambda usage: usage.cache)
