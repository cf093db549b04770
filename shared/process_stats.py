"""Statistics of the process-wide parts no node object owns: the internal plane's token check
(services/transport/internal_auth.py) and the index publisher (shared/index/publisher.py).

Each such part registers itself once; a node's Stats, and its own /metrics, add
``process_counters()`` to the node's counters. Parts are held weakly (a test process builds and
drops many), and counters of the same name from several live parts are summed.
"""

from __future__ import annotations

import threading
import weakref
from typing import Protocol


class CounterSource(Protocol):
    def counters(self) -> dict[str, float]: ...


_sources: weakref.WeakSet = weakref.WeakSet()
_lock = threading.Lock()


def register(source: CounterSource) -> None:
    with _lock:
        _sources.add(source)


def process_counters() -> dict[str, float]:
    with _lock:
        sources = list(_sources)
    out: dict[str, float] = {}
    for source in sources:
        for name, value in source.counters().items():
            out[name] = out.get(name, 0.0) + value
    return out
