"""In-process index backend for single-process use and unit tests. Same semantics as Redis:
epochs from one counter, heartbeat TTLs, entries tagged with the epoch that wrote them, lapsed
nodes pruned by live_nodes, one cluster config record agreed at registration
(shared/index/cluster_config.py)."""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable

from shared.index.cluster_config import ConfigMismatchError, agrees, disagreements
from shared.index.types import (
    MAX_HOLDERS_PER_KEY,
    MEMBER_LOG_LENGTH,
    IndexEvents,
    LookupResult,
    MembershipChanges,
    MmEntry,
    NodeInfo,
    NodeState,
    is_resumable,
)
from shared.types import BlockHash, MmHash


class InProcessIndex:
    def __init__(self, *, namespace: str = "default", clock: Callable[[], float] = time.monotonic) -> None:
        self.namespace = namespace
        self._clock = clock
        self._lock = threading.Lock()
        self._random = random.Random(0)  # the holders sampled past MAX_HOLDERS_PER_KEY
        self._num_epochs = 0  # the last epoch handed out, to any node
        self._node_to_epoch: dict[str, int] = {}
        self._node_to_state: dict[str, tuple[NodeState, float]] = {}  # state, expires_at
        self._mm: dict[MmHash, dict[str, tuple[int, MmEntry]]] = {}
        self._kv: dict[BlockHash, dict[str, tuple[int, str]]] = {}
        self.num_round_trips = 0
        # Bumped by registration, deregistration and prune. As in Redis, an index starts counting at
        # the wall clock in microseconds, so no reader takes a new incarnation's log for its
        # predecessor's continuation (redis_scripts.LOG_CHANGE).
        self._membership_version = time.time_ns() // 1000
        self._member_log: deque[tuple[int, str]] = deque(maxlen=MEMBER_LOG_LENGTH)  # (version, node id)
        self._agreed: dict[str, str] = {}  # the cluster config record: setting -> value
        self._agreed_until = 0.0  # when it lapses, unless a registration or heartbeat extends it

    def register_node(self, node: NodeInfo, *, ttl_s: float, seal_fn: Callable[[int], str] | None = None) -> int:
        with self._lock:
            settings = node.config.settings()
            agreed = self._agreed_config()
            if found := disagreements(settings, agreed):
                raise ConfigMismatchError(self.namespace, node.node_id, found)
            self._agreed = {**settings, **agreed}
            self._extend_agreement(ttl_s)
            self._num_epochs += 1
            epoch = self._num_epochs
            seal = seal_fn(epoch) if seal_fn is not None else ""
            self._node_to_epoch[node.node_id] = epoch
            self._node_to_state[node.node_id] = (NodeState(node, epoch, 0.0, 0.0, seal), self._clock() + ttl_s)
            self._log_change(node.node_id)
            return epoch

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
            if self._node_to_epoch.get(node_id) != epoch or node_id not in self._node_to_state:
                return False
            state, expires_at = self._node_to_state[node_id]
            if expires_at <= self._clock():  # lapsed: it must register again, as with Redis
                return False
            adapters = frozenset(adapters)
            beat = NodeState(state.info, epoch, float(load), float(kv_usage), seal, adapters)
            self._node_to_state[node_id] = (beat, self._clock() + ttl_s)
            if adapters != state.adapters:
                self._log_change(node_id)
            if self._agreed_config():
                self._extend_agreement(ttl_s)
            return True

    def deregister_node(self, node_id: str, epoch: int) -> None:
        with self._lock:
            if self._node_to_epoch.get(node_id) == epoch:
                self._node_to_epoch.pop(node_id)
                self._node_to_state.pop(node_id, None)
                self._log_change(node_id)

    def live_nodes(self) -> dict[str, NodeState]:
        with self._lock:
            now = self._clock()
            for node_id in [n for n, (_, expires) in self._node_to_state.items() if expires <= now]:
                del self._node_to_state[node_id]
                self._node_to_epoch.pop(node_id, None)
                self._log_change(node_id)
            agreed = self._agreed_config()
            return {node_id: state for node_id, (state, _) in self._node_to_state.items() if agrees(state.info.config.settings(), agreed)}

    def membership_changes(self, since: int) -> MembershipChanges | None:
        with self._lock:
            version = self._membership_version
            if version < since:
                return None
            if version == since:
                return MembershipChanges(version, {}, frozenset())
            if not self._member_log or self._member_log[0][0] > since + 1:
                return None
            now, agreed = self._clock(), self._agreed_config()
            nodes, gone = {}, set()
            for node_id in dict.fromkeys(n for v, n in self._member_log if v > since):
                state, expires = self._node_to_state.get(node_id, (None, 0.0))
                if state is not None and expires > now and agrees(state.info.config.settings(), agreed):
                    nodes[node_id] = state
                else:
                    gone.add(node_id)
            return MembershipChanges(version, nodes, frozenset(gone))

    def _log_change(self, node_id: str) -> None:
        self._membership_version += 1
        self._member_log.append((self._membership_version, node_id))

    def publish(self, node_id: str, epoch: int, events: IndexEvents) -> None:
        with self._lock:
            for mm_hash, entry in events.mm_stored.items():
                self._mm.setdefault(mm_hash, {})[node_id] = (epoch, entry)
            for mm_hash in events.mm_evicted:
                self._mm.get(mm_hash, {}).pop(node_id, None)
            for block_hash, tier in events.kv_stored.items():
                self._kv.setdefault(block_hash, {})[node_id] = (epoch, tier)
            for block_hash in events.kv_evicted:
                self._kv.get(block_hash, {}).pop(node_id, None)

    def lookup(self, mm_hashes: list[MmHash], block_hashes: list[BlockHash]) -> LookupResult:
        with self._lock:
            self.num_round_trips += 1
            now = self._clock()
            node_to_epoch = {nid: state.epoch for nid, (state, expires) in self._node_to_state.items() if expires > now}

            def live(node_id: str, epoch: int) -> bool:
                return node_to_epoch.get(node_id) == epoch

            def holders(entries: dict[str, tuple[int, object]]) -> tuple[dict[str, object], bool]:
                """The live holders, and whether they were sampled (redis_scripts.py's bound)."""
                sampled = len(entries) > MAX_HOLDERS_PER_KEY
                names = self._random.sample(sorted(entries), MAX_HOLDERS_PER_KEY) if sampled else entries
                return {nid: entries[nid][1] for nid in names if live(nid, entries[nid][0])}, sampled

            mm_holders = {h: holders(self._mm.get(h, {}))[0] for h in mm_hashes}
            node_to_num_prefix_blocks: dict[str, int] = {}
            if block_hashes:
                first, sampled = holders(self._kv.get(block_hashes[0], {}))
                if sampled:  # the live holders of the deepest block with entries, checked from block 0
                    lo, hi = 0, len(block_hashes) - 1
                    while lo < hi:
                        mid = (lo + hi + 1) // 2
                        lo, hi = (mid, hi) if self._kv.get(block_hashes[mid]) else (lo, mid - 1)
                    deepest = holders(self._kv.get(block_hashes[lo], {}))[0]
                    node_to_num_prefix_blocks = self._walk(block_hashes, set(deepest or first), live)
                if not node_to_num_prefix_blocks:  # the exact walk, or none of the deepest's holders held block 0
                    node_to_num_prefix_blocks = self._walk(block_hashes, set(first), live)
            named = {nid for holders in mm_holders.values() for nid in holders} | set(node_to_num_prefix_blocks)
            return LookupResult(
                node_to_epoch={nid: node_to_epoch[nid] for nid in named},
                mm_holders=mm_holders,
                node_to_num_prefix_blocks=node_to_num_prefix_blocks,
                membership_version=self._membership_version,
            )

    def close(self) -> None:
        pass

    def _walk(self, block_hashes: list[BlockHash], matching: set[str], live) -> dict[str, int]:
        """Each of ``matching`` -> the blocks up to the last one it can resume after
        (types.is_resumable) before the first it lacks, for those with at least one."""
        ends: dict[str, int] = {}
        for num_blocks, block_hash in enumerate(block_hashes, start=1):
            entries = {nid: entry for nid, (epoch, entry) in self._kv.get(block_hash, {}).items() if live(nid, epoch)}
            matching &= set(entries)
            if not matching:
                break
            ends.update({nid: num_blocks for nid in matching if is_resumable(entries[nid])})
        return ends

    def _agreed_config(self) -> dict[str, str]:
        """The cluster config record, empty once lapsed (call with the lock held)."""
        if self._agreed and self._agreed_until <= self._clock():
            self._agreed = {}
        return self._agreed

    def _extend_agreement(self, ttl_s: float) -> None:
        self._agreed_until = max(self._agreed_until, self._clock() + ttl_s)
