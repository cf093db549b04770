"""Publishes one node's cache contents to the index, off the model loop.

The node calls ``record`` from its own thread (cheap: a lock and a queue append). Once the node
serves, ``start`` registers it (a node whose settings the cluster refuses learns it there:
ConfigMismatchError, shared/index/cluster_config.py), and a background thread heartbeats every
ttl/3 with the node's load and publishes queued events in batches. A heartbeat is sent only
while ``alive_fn`` says the node's compute loops make progress (shared/liveness.py), so a hung
node leaves the rotation within its TTL. ``deregister`` (a drain) withdraws the node and its entries at once. The
publisher also keeps the node's current holdings, so that after the index was unreachable (or
the node re-registered under a new epoch) it republishes the full snapshot: the index catches up
by itself, and a node never depends on the index to serve. A re-registration the cluster refuses
(it was redeployed with other settings meanwhile) ends the publisher and calls ``on_refused``.

A failed call (a timeout on a loaded machine, an outage) keeps the epoch: the failed batch goes
back in front of what was recorded since, and the next round heartbeats first. The heartbeat
decides: accepted, the node publishes on under the same epoch (a slow reply costs no
re-registration, so routers never see the node's entries go stale); refused (the record lapsed
or the index restarted empty), the node registers again and republishes its snapshot.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from shared import process_stats
from shared.index.backend import CacheIndex
from shared.index.cluster_config import ConfigMismatchError
from shared.index.types import IndexEvents, IndexUnavailableError, MmEntry, NodeInfo
from shared.node_metrics import Counter, Histogram, counter, histogram
from shared.types import BlockHash, MmHash

log = logging.getLogger("tessera.index")

LoadFn = Callable[[], tuple[float, float]]  # -> (load, kv_usage)
PUBLISH_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


@dataclass(slots=True)
class PublisherMetrics:
    """The index's health as this node sees it."""

    num_publish_failures: Counter = counter("index_publish_failures_total", "Index calls that failed: the index was unreachable")
    num_heartbeats_withheld: Counter = counter(
        "index_heartbeats_withheld_total", "Heartbeats not sent because the node's compute loop made no progress"
    )
    publish_time: Histogram = histogram("index_publish_seconds", "One batch of cache events published: one round trip", PUBLISH_BUCKETS_S)


@dataclass(slots=True)
class _PendingChanges:
    """Changes not yet published, net: a hash is in at most one of stored and evicted, so a batch
    publishes the same result in any order (a store after an eviction of the same hash wins)."""

    mm_stored: dict[MmHash, MmEntry] = field(default_factory=dict)
    mm_evicted: set[MmHash] = field(default_factory=set)
    kv_stored: dict[BlockHash, str] = field(default_factory=dict)
    kv_evicted: set[BlockHash] = field(default_factory=set)

    def add(self, events: IndexEvents) -> None:
        """Apply ``events`` after what is pending (within one batch, stores before evictions,
        as the index applies them)."""
        for h, entry in events.mm_stored.items():
            self.mm_evicted.discard(h)
            self.mm_stored[h] = entry
        for h in events.mm_evicted:
            self.mm_stored.pop(h, None)
            self.mm_evicted.add(h)
        for h, tier in events.kv_stored.items():
            self.kv_evicted.discard(h)
            self.kv_stored[h] = tier
        for h in events.kv_evicted:
            self.kv_stored.pop(h, None)
            self.kv_evicted.add(h)

    def is_empty(self) -> bool:
        return not (self.mm_stored or self.mm_evicted or self.kv_stored or self.kv_evicted)

    def to_events(self) -> IndexEvents:
        return IndexEvents(dict(self.mm_stored), list(self.mm_evicted), dict(self.kv_stored), list(self.kv_evicted))


class IndexPublisher:
    def __init__(
        self,
        index: CacheIndex,
        node: NodeInfo,
        *,
        ttl_s: float = 5.0,
        load_fn: LoadFn = lambda: (0.0, 0.0),
        alive_fn: Callable[[], bool] = lambda: True,
        adapters_fn: Callable[[], frozenset[str]] = frozenset,
        flush_s: float = 0.05,
        on_refused: Callable[[ConfigMismatchError], None] | None = None,
    ) -> None:
        self.index = index
        self.node = node
        self.ttl_s = ttl_s
        self.load_fn = load_fn
        self.alive_fn = alive_fn
        self.adapters_fn = adapters_fn  # the fingerprints of the LoRA adapters the node serves, for its record
        self._beat_now = False  # the record changed (adapters): heartbeat at the next wake, not at ttl/3
        self.flush_s = flush_s
        self.on_refused = on_refused
        self.epoch: int | None = None
        self.refusal: ConfigMismatchError | None = None  # set once the cluster refused this node
        self._lock = threading.Lock()
        self._pending = _PendingChanges()
        self._publishing = False  # a batch taken from _pending is on its way to the index
        self._mm_holdings: dict[MmHash, MmEntry] = {}
        self._kv_holdings: dict[BlockHash, str] = {}
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self.metrics = PublisherMetrics()
        process_stats.register(self)  # the node's Stats carry the index's health as this node sees it
        self._thread = threading.Thread(target=self._run, name="index-publisher", daemon=True)

    def start(self) -> None:
        """Join the cluster: call once the node answers requests. Raises ConfigMismatchError if
        the cluster refuses this node's settings; an unreachable index is no error (the
        background thread keeps trying)."""
        try:
            self._register()
        except IndexUnavailableError as exc:
            self.metrics.num_publish_failures.inc()
            log.warning("index unreachable (%s); serving from local caches, will register once it answers", exc)
        except ConfigMismatchError as exc:
            self.refusal = exc
            raise
        self._thread.start()

    def record(self, events: IndexEvents) -> None:
        if events.is_empty():
            return
        with self._lock:
            self._mm_holdings.update(events.mm_stored)
            for h in events.mm_evicted:
                self._mm_holdings.pop(h, None)
            self._kv_holdings.update(events.kv_stored)
            for h in events.kv_evicted:
                self._kv_holdings.pop(h, None)
            self._pending.add(events)
        self._wake.set()

    def record_changed(self) -> None:
        """What the node's record says changed (the adapters it serves): send it now, so routers
        see it within a lookup, not a heartbeat period."""
        self._beat_now = True
        self._wake.set()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Publish what is pending now; True once the index has it (tests and shutdown)."""
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self.epoch is not None and self._pending.is_empty() and not self._publishing:
                    return True
            time.sleep(0.02)
        return False

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def deregister(self) -> None:
        """Leave the cluster now (a drain): stop heartbeating, withdraw every entry this node
        published, and remove its node record, so no router picks it again. Best effort: with the
        index down, the record lapses after its TTL instead."""
        self.stop()
        epoch = self.epoch
        if epoch is None:
            return
        with self._lock:
            withdrawn = IndexEvents(mm_evicted=list(self._mm_holdings), kv_evicted=list(self._kv_holdings))
        try:
            self.index.publish(self.node.node_id, epoch, withdrawn)
            self.index.deregister_node(self.node.node_id, epoch)
        except IndexUnavailableError as exc:
            log.warning("could not deregister from the index (%s); the node lapses after its TTL", exc)
        self.epoch = None

    def _run(self) -> None:
        next_heartbeat = 0.0
        while not self._stopped.is_set():
            self._wake.wait(timeout=min(self.flush_s * 4, self.ttl_s / 3))
            self._wake.clear()
            try:
                if self.epoch is None:
                    self._register()
                    next_heartbeat = 0.0  # a new record holds no adapters: the first heartbeat brings them
                elif time.monotonic() >= next_heartbeat or self._beat_now:
                    if not self.alive_fn():
                        # A hung compute loop: let the record lapse so routers stop choosing us.
                        self.metrics.num_heartbeats_withheld.inc()
                        if self.metrics.num_heartbeats_withheld.value == 1:
                            log.error("compute loop is not making progress; withholding heartbeats")
                        next_heartbeat = time.monotonic() + self.ttl_s / 3
                        continue
                    load, kv_usage = self.load_fn()
                    self._beat_now = False
                    beat = {"load": load, "kv_usage": kv_usage, "ttl_s": self.ttl_s, "adapters": self.adapters_fn()}
                    if not self.index.heartbeat(self.node.node_id, self.epoch, **beat):
                        self.epoch = None  # expired or fenced: register again and republish
                        continue
                    next_heartbeat = time.monotonic() + self.ttl_s / 3
                with self._lock:
                    batch, self._pending = self._pending, _PendingChanges()
                    self._publishing = not batch.is_empty()
                if self._publishing:
                    try:
                        started = time.monotonic()
                        self.index.publish(self.node.node_id, self.epoch, batch.to_events())
                        self.metrics.publish_time.observe(time.monotonic() - started)
                    except IndexUnavailableError:
                        with self._lock:  # the failed batch first, then what was recorded since
                            batch.add(self._pending.to_events())
                            self._pending = batch
                        raise
                    finally:
                        self._publishing = False
            except IndexUnavailableError as exc:
                self.metrics.num_publish_failures.inc()
                if self.epoch is not None:
                    log.warning("index call failed (%s); serving from local caches, will catch up", exc)
                next_heartbeat = 0.0  # the heartbeat says whether the epoch still holds
                self._stopped.wait(min(1.0, self.ttl_s / 3))
            except ConfigMismatchError as exc:
                log.error("%s", exc)
                self.refusal = exc
                if self.on_refused is not None:
                    self.on_refused(exc)
                return

    def _register(self) -> None:
        epoch = self.index.register_node(self.node, ttl_s=self.ttl_s)
        with self._lock:
            snapshot = IndexEvents(mm_stored=dict(self._mm_holdings), kv_stored=dict(self._kv_holdings))
            self._pending = _PendingChanges()
        started = time.monotonic()
        self.index.publish(self.node.node_id, epoch, snapshot)
        self.metrics.publish_time.observe(time.monotonic() - started)
        self.epoch = epoch
