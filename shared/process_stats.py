"""Metrics of the process-wide parts no node object owns: the internal plane's token check
(services/transport/internal_auth.py), the index publisher (shared/index/publisher.py) and the
index record sealer (shared/index/record_seal.py).

Each such part registers itself once; ``node_snapshot`` adds their metrics records
(shared/node_metrics.py) to a node's own, for its Stats and its /metrics. Parts are held weakly (a
test process builds and drops many), and metrics of the same name from several live parts are
summed.
"""

from __future__ import annotations

import threading
import weakref
from typing import Protocol

from shared.node_metrics import Snapshot, snapshot


class MetricsSource(Protocol):
    @property
    def metrics(self) -> object: ...  # a metrics record


_sources: weakref.WeakSet = weakref.WeakSet()
_lock = threading.Lock()


def register(source: MetricsSource) -> None:
    with _lock:
        _sources.add(source)


def node_snapshot(*records: object) -> Snapshot:
    """The metrics of ``records`` (a node's, its admission's) with this process's parts'."""
    with _lock:
        sources = list(_sources)
    return snapshot(*records, *(source.metrics for source in sources))
