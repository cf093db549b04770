"""The index backend contract and the one place that chooses a backend.

Semantics every backend must honour (tests/shared/index/test_conformance.py checks them):
  * register_node starts a new epoch for the node id, greater than every epoch the index ever
    handed out (a restart never inherits old entries, even after its node was pruned);
  * a node's entries are served only while its heartbeat key is alive and only if they were
    written under its current epoch;
  * publish applies a batch atomically; lookup answers a whole request in one round trip and
    stops the block list at the first block no live node holds;
  * membership: the live node records *are* the cluster. live_nodes lists them (and prunes the
    records of nodes whose heartbeat lapsed); deregister_node removes a draining node at once.
"""

from __future__ import annotations

from typing import Protocol

from shared.index.types import IndexEvents, LookupResult, NodeInfo, NodeState
from shared.types import BlockHash, MmHash


class CacheIndex(Protocol):
    def register_node(self, node: NodeInfo, *, ttl_s: float) -> int:
        """Announce ``node`` and return its new epoch."""

    def heartbeat(self, node_id: str, epoch: int, *, load: float, kv_usage: float, ttl_s: float) -> bool:
        """Refresh liveness and load; False if ``epoch`` is no longer the node's current one."""

    def deregister_node(self, node_id: str, epoch: int) -> None:
        """Remove ``node_id`` from the cluster now (a drain), if ``epoch`` is still its current one."""

    def live_nodes(self) -> dict[str, NodeState]:
        """Every live node (heartbeat within its TTL); forgets the nodes whose heartbeat lapsed."""

    def publish(self, node_id: str, epoch: int, events: IndexEvents) -> None: ...

    def lookup(self, mm_hashes: list[MmHash], block_hashes: list[BlockHash]) -> LookupResult: ...

    def close(self) -> None: ...


def create_index(url: str, *, namespace: str) -> CacheIndex:
    """``memory://`` for the in-process backend, ``redis://host:port/db`` for Redis or Valkey."""
    if url.startswith("memory://"):
        from shared.index.memory_backend import InProcessIndex

        return InProcessIndex(namespace=namespace)
    if url.startswith(("redis://", "rediss://", "unix://")):
        from shared.index.circuit_breaker import BreakerIndex
        from shared.index.redis_backend import RedisIndex

        # A networked index gets a circuit breaker: once it is failing, calls fail at once.
        return BreakerIndex(RedisIndex(url, namespace=namespace))
    raise ValueError(f"unsupported index URL {url!r}: use memory:// or redis://host:port/db")
