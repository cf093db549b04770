"""A CacheIndex whose node records are sealed on write and checked on read
(shared/index/record_seal.py has the rule). A rejected record is left out of every listing
(live_nodes, membership_changes), so it is never a member: never routed to, dialled, or credited
with the cached work a lookup names it for (a lookup's names count only through the membership)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from shared import process_stats
from shared.index.backend import CacheIndex
from shared.index.record_seal import RecordSealer
from shared.index.types import IndexEvents, LookupResult, MembershipChanges, NodeInfo, NodeState
from shared.types import BlockHash, MmHash


class SealedIndex:
    def __init__(self, inner: CacheIndex, sealer: RecordSealer) -> None:
        self.inner = inner
        self.sealer = sealer
        self._lock = threading.Lock()
        self._node_to_info: dict[str, NodeInfo] = {}  # the nodes this process registered, to re-seal at heartbeats
        process_stats.register(sealer)  # rejections show in this process's metrics

    # seal_fn and seal, the backend's hooks, are this wrapper's to fill: what a caller passes is replaced.
    def register_node(self, node: NodeInfo, *, ttl_s: float, seal_fn: Callable[[int], str] | None = None) -> int:
        with self._lock:
            self._node_to_info[node.node_id] = node
        return self.inner.register_node(
            node, ttl_s=ttl_s, seal_fn=lambda epoch: self.sealer.seal(NodeState(node, epoch, 0.0, 0.0), ttl_s=ttl_s)
        )

    def heartbeat(
        self,
        node_id: str,
        epoch: int,
        *,
        load: float,
        kv_usage: float,
        ttl_s: float,
        seal: str = "",
        adapters: frozenset[str] = frozenset(),
    ) -> bool:
        with self._lock:
            info = self._node_to_info[node_id]
        seal = self.sealer.seal(NodeState(info, epoch, load, kv_usage, adapters=adapters), ttl_s=ttl_s)
        return self.inner.heartbeat(node_id, epoch, load=load, kv_usage=kv_usage, ttl_s=ttl_s, seal=seal, adapters=adapters)

    def deregister_node(self, node_id: str, epoch: int) -> None:
        self.inner.deregister_node(node_id, epoch)

    def live_nodes(self) -> dict[str, NodeState]:
        return self.sealer.admitted(self.inner.live_nodes())

    def membership_changes(self, since: int) -> MembershipChanges | None:
        return self.sealer.admitted_changes(self.inner.membership_changes(since))

    def publish(self, node_id: str, epoch: int, events: IndexEvents) -> None:
        self.inner.publish(node_id, epoch, events)

    def lookup(self, mm_hashes: list[MmHash], block_hashes: list[BlockHash]) -> LookupResult:
        # A lookup names holders without their records, so there is no seal here to check: its
        # names count only through a membership read from this index (LookupResult says so).
        return self.inner.lookup(mm_hashes, block_hashes)

    def close(self) -> None:
        self.inner.close()
