"""The index backend contract and the one place that chooses a backend.

Semantics every backend must honour (tests/shared/index/test_conformance.py checks them):
  * register_node starts a new epoch for the node id, greater than every epoch the index ever
    handed out (a restart never inherits old entries, even after its node was pruned);
  * a node's entries are served only while its heartbeat key is alive and only if they were
    written under its current epoch;
  * publish applies a batch atomically; lookup answers a whole request in one round trip, stops
    the block list at the first block no live node holds, and names only the nodes holding
    something, by id and current epoch, without their records: its cost is independent of the
    number of nodes. Trust and cluster settings are checked on records, so only where records
    are listed (live_nodes, membership_changes); a reader credits a lookup's name only while its
    membership holds that node under that epoch;
  * a membership version moves with every registration, deregistration and prune (lookup
    returns it), so a reader knows when to call live_nodes again, or membership_changes, which
    names the nodes each move was for (the latest MEMBER_LOG_LENGTH) with their records;
  * a record carries the seal its writer gave at registration and at its latest heartbeat,
    byte for byte (shared/index/sealed_index.py checks it; backends store it and hand it back);
  * config agreement (shared/index/cluster_config.py): a registration whose cluster settings
    disagree with the namespace's record raises ConfigMismatchError and writes nothing; else its
    settings fill in what the record lacks. Registrations and heartbeats keep the record alive
    for a TTL; live_nodes and membership_changes list only nodes agreeing with it;
  * membership: the live node records *are* the cluster. live_nodes lists them (and prunes the
    records of nodes whose heartbeat lapsed); deregister_node removes a draining node at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from shared.index.record_seal import DEFAULT_MAX_SKEW_S, RecordSealer
from shared.index.types import IndexEvents, LookupResult, MembershipChanges, NodeInfo, NodeState
from shared.types import BlockHash, MmHash


class CacheIndex(Protocol):
    def register_node(self, node: NodeInfo, *, ttl_s: float, seal_fn: Callable[[int], str] | None = None) -> int:
        """Announce ``node`` and return its new epoch; ``seal_fn(epoch)`` is the record's seal.
        Raises ConfigMismatchError when ``node.config`` disagrees with the cluster's."""

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
        """Refresh liveness, load, the adapters the node serves and the record's seal; False if
        ``epoch`` is no longer the node's current one. A change of adapters is a membership change
        (logged, so readers see it at their next lookup, not at their next listing)."""

    def deregister_node(self, node_id: str, epoch: int) -> None:
        """Remove ``node_id`` from the cluster now (a drain), if ``epoch`` is still its current one."""

    def live_nodes(self) -> dict[str, NodeState]:
        """Every live node (heartbeat within its TTL); forgets the nodes whose heartbeat lapsed."""

    def membership_changes(self, since: int) -> MembershipChanges | None:
        """The nodes whose membership changed after version ``since`` (lookup's
        membership_version), reading only their records; None when the index no longer knows
        them all (more than MEMBER_LOG_LENGTH changes ago, or a restarted index): call live_nodes."""

    def publish(self, node_id: str, epoch: int, events: IndexEvents) -> None: ...

    def lookup(self, mm_hashes: list[MmHash], block_hashes: list[BlockHash]) -> LookupResult: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class IndexCredentials:
    """How this process authenticates to a networked index; they come from files or the
    environment, never from the URL or a flag (command lines are visible to every local user)."""

    username: str | None = None  # an ACL user; None: the default user
    password: str | None = field(default=None, repr=False)
    tls_ca: Path | None = None  # the CA that signed a rediss:// server's certificate; None: the system's


def create_index(
    url: str,
    *,
    namespace: str,
    credentials: IndexCredentials | None = None,
    record_key: bytes | None = None,
    record_max_skew_s: float = DEFAULT_MAX_SKEW_S,
) -> CacheIndex:
    """``memory://`` for the in-process backend, ``redis://host:port/db`` (or ``rediss://`` for
    TLS) for Redis or Valkey. With ``record_key``, node records are sealed and checked
    (shared/index/record_seal.py)."""
    if url.startswith("memory://"):
        from shared.index.memory_backend import InProcessIndex

        return _sealed(InProcessIndex(namespace=namespace), namespace, record_key, record_max_skew_s)
    if url.startswith(("redis://", "rediss://", "unix://")):
        from shared.index.circuit_breaker import BreakerIndex
        from shared.index.redis_backend import RedisIndex

        # A networked index gets a circuit breaker, outermost: once it is failing, calls fail at once.
        redis_index = RedisIndex(url, namespace=namespace, credentials=credentials or IndexCredentials())
        return BreakerIndex(_sealed(redis_index, namespace, record_key, record_max_skew_s))
    raise ValueError(f"unsupported index URL {url!r}: use memory:// or redis://host:port/db")


def _sealed(index: CacheIndex, namespace: str, record_key: bytes | None, max_skew_s: float) -> CacheIndex:
    if record_key is None:
        return index
    from shared.index.sealed_index import SealedIndex

    return SealedIndex(index, RecordSealer(record_key, namespace, max_skew_s=max_skew_s))
