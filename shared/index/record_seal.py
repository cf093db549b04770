"""Sealed node records: the index's membership can be trusted only as far as its writers.

Why: the node records in the index *are* the cluster. Whoever can write to the index could add a
record pointing at their own listener, and the gateway would hand it prompts, images and the
internal token. So every record is sealed with a key only cluster members hold (derived from the
internal secret, services/transport/internal_auth.py), and readers ignore, and count, records
whose seal fails.

Seal layout: "{sealed_at_ms}.{ttl_ms}.{mac}", where mac is HMAC-SHA256, in hex, over the JSON list
  [SEAL_VERSION, namespace, node_id, role, grpc, data, can_encode, settings, epoch, load,
   kv_usage, adapters, sealed_at_ms, ttl_ms]
with settings the node's cluster settings as sorted [name, value] pairs (cluster_config.py), and
load and kv_usage as repr(float) (what the index stores and hands back), and adapters the
stored field (types.adapters_field): a forged record cannot claim adapters to draw requests. The namespace is the
model id, "name@fingerprint", so a record sealed for one set of weights fails under another.

A record is admitted when:
  * it carries a seal whose MAC verifies (else "unsealed" or "bad_seal");
  * it was sealed at most ttl + max_skew ago, and not more than max_skew in the future ("stale"):
    a node re-seals at every heartbeat (every ttl/3), so only a copy of an old record is older;
  * its epoch is not below one this reader already admitted for the node id ("old_epoch"): a
    replay of a node's earlier incarnation after the reader has seen the current one.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from shared.index.types import MembershipChanges, NodeState, adapters_field
from shared.node_metrics import Counter, counter

log = logging.getLogger("tessera.index")

SEAL_VERSION = 3
DEFAULT_MAX_SKEW_S = 30.0  # clock difference tolerated between a writer and a reader
# Node ids whose highest admitted epoch a reader remembers; past it the least recently admitted
# is forgotten (its replays are then caught by the staleness rule alone). Ids churn with pods.
MAX_REMEMBERED_NODES = 65536
REJECTION_REASONS = ("unsealed", "bad_seal", "stale", "old_epoch")


@dataclass(slots=True)
class RejectionMetrics:
    """Node records read back and not trusted, by reason (one field per REJECTION_REASONS)."""

    unsealed: Counter = counter("index_records_rejected_unsealed_total", "Index node records ignored: no seal")
    bad_seal: Counter = counter("index_records_rejected_bad_seal_total", "Index node records ignored: the seal does not verify")
    stale: Counter = counter("index_records_rejected_stale_total", "Index node records ignored: sealed too long ago, or in the future")
    old_epoch: Counter = counter("index_records_rejected_old_epoch_total", "Index node records ignored: an epoch older than one admitted")


def _mac(key: bytes, namespace: str, state: NodeState, sealed_at_ms: int, ttl_ms: int) -> str:
    info = state.info
    fields = [
        SEAL_VERSION,
        namespace,
        info.node_id,
        info.role,
        info.grpc_address,
        info.data_address,
        info.can_encode,
        sorted(info.config.settings().items()),
        state.epoch,
        repr(float(state.load)),
        repr(float(state.kv_usage)),
        adapters_field(state.adapters),
        sealed_at_ms,
        ttl_ms,
    ]
    return hmac.new(key, json.dumps(fields, separators=(",", ":")).encode(), hashlib.sha256).hexdigest()


class RecordSealer:
    """Seals this process's node records and decides which records read back are trusted."""

    def __init__(
        self, key: bytes, namespace: str, *, max_skew_s: float = DEFAULT_MAX_SKEW_S, clock: Callable[[], float] = time.time
    ) -> None:
        if len(key) < 16:
            raise ValueError("a record-sealing key needs at least 16 bytes")
        self._key = key
        self.namespace = namespace
        self.max_skew_ms = int(max_skew_s * 1000)
        self._clock = clock  # wall time: seals are compared across machines
        self._lock = threading.Lock()
        self._node_to_max_epoch: dict[str, int] = {}
        self.metrics = RejectionMetrics()

    def seal(self, state: NodeState, *, ttl_s: float) -> str:
        sealed_at_ms, ttl_ms = int(self._clock() * 1000), int(ttl_s * 1000)
        return f"{sealed_at_ms}.{ttl_ms}.{_mac(self._key, self.namespace, state, sealed_at_ms, ttl_ms)}"

    def rejection(self, state: NodeState) -> str | None:
        """Why ``state`` is not to be trusted (one of REJECTION_REASONS), or None to admit it."""
        if not state.seal:
            return "unsealed"
        try:
            sealed_at, ttl, mac = state.seal.split(".")
            sealed_at_ms, ttl_ms = int(sealed_at), int(ttl)
        except ValueError:
            return "bad_seal"
        if not hmac.compare_digest(mac, _mac(self._key, self.namespace, state, sealed_at_ms, ttl_ms)):
            return "bad_seal"
        age_ms = int(self._clock() * 1000) - sealed_at_ms
        if age_ms > ttl_ms + self.max_skew_ms or age_ms < -self.max_skew_ms:
            return "stale"
        with self._lock:
            node_id = state.info.node_id
            max_epoch = self._node_to_max_epoch.pop(node_id, 0)
            self._node_to_max_epoch[node_id] = max(max_epoch, state.epoch)  # re-inserted: most recent last
            if state.epoch < max_epoch:
                return "old_epoch"
            if len(self._node_to_max_epoch) > MAX_REMEMBERED_NODES:
                del self._node_to_max_epoch[next(iter(self._node_to_max_epoch))]
        return None

    def admitted_changes(self, changes: MembershipChanges | None) -> MembershipChanges | None:
        """``changes`` with the untrusted records among its nodes counted as gone."""
        if changes is None:
            return None
        nodes = self.admitted(changes.nodes)
        return MembershipChanges(changes.version, nodes, changes.gone | (changes.nodes.keys() - nodes.keys()))

    def admitted(self, nodes: dict[str, NodeState]) -> dict[str, NodeState]:
        """The trusted records of ``nodes``; the others are counted and logged."""
        out = {}
        for node_id, state in nodes.items():
            reason = self.rejection(state)
            if reason is None:
                out[node_id] = state
                continue
            rejected: Counter = getattr(self.metrics, reason)
            with self._lock:  # the increment and the read that says whether it was the first
                rejected.inc()
                first = rejected.value == 1
            # Logged at the first rejection per reason: a forged record is read on every lookup.
            (log.warning if first else log.debug)(
                "ignoring the index record of node %r (%s at %s): %s", node_id, state.info.role, state.info.grpc_address, reason
            )
        return out
