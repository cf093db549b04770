"""What a router reads from the index, awaited on its event loop (``IndexReader``), and the one
place that chooses a reader.

The gateway serves every stream from one event loop, so its reads (a lookup per route, the
membership's listings) must never block it: a hung index would stall every stream until the
circuit breaker opened. A reader's calls are coroutines: over Redis or Valkey they go through
``redis.asyncio`` (redis_reader.py); over the in-process index (memory://, the simulator, unit
tests) they call it directly, as it does no I/O. They answer what the writer-side CacheIndex's
calls of the same names answer (backend.py states the contract; the conformance suite checks
both sides against every backend), and raise IndexUnavailableError when the index does not.

The wrappers mirror the writer side's: records sealed on write are checked on read
(``SealedReader``), and a networked reader fails fast once failing (``BreakerReader``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from shared import process_stats
from shared.index.backend import CacheIndex, IndexCredentials
from shared.index.circuit_breaker import CircuitBreaker
from shared.index.record_seal import DEFAULT_MAX_SKEW_S, RecordSealer
from shared.index.types import LookupResult, MembershipChanges, NodeState
from shared.types import BlockHash, MmHash

T = TypeVar("T")


class IndexReader(Protocol):
    async def lookup(self, mm_hashes: list[MmHash], block_hashes: list[BlockHash]) -> LookupResult: ...

    async def live_nodes(self) -> dict[str, NodeState]: ...

    async def membership_changes(self, since: int) -> MembershipChanges | None: ...

    async def close(self) -> None: ...


class LocalReader:
    """The reader of an in-process index, whose calls never wait on anything."""

    def __init__(self, index: CacheIndex) -> None:
        self.index = index

    async def lookup(self, mm_hashes: list[MmHash], block_hashes: list[BlockHash]) -> LookupResult:
        return self.index.lookup(mm_hashes, block_hashes)

    async def live_nodes(self) -> dict[str, NodeState]:
        return self.index.live_nodes()

    async def membership_changes(self, since: int) -> MembershipChanges | None:
        return self.index.membership_changes(since)

    async def close(self) -> None:
        self.index.close()


class SealedReader:
    """Node records checked on read (shared/index/sealed_index.py has the rule)."""

    def __init__(self, inner: IndexReader, sealer: RecordSealer) -> None:
        self.inner, self.sealer = inner, sealer
        process_stats.register(sealer)  # rejections show in this process's metrics

    async def lookup(self, mm_hashes: list[MmHash], block_hashes: list[BlockHash]) -> LookupResult:
        return await self.inner.lookup(mm_hashes, block_hashes)  # names count only through the membership

    async def live_nodes(self) -> dict[str, NodeState]:
        return self.sealer.admitted(await self.inner.live_nodes())

    async def membership_changes(self, since: int) -> MembershipChanges | None:
        return self.sealer.admitted_changes(await self.inner.membership_changes(since))

    async def close(self) -> None:
        await self.inner.close()


class BreakerReader:
    """A reader whose calls fail at once while its breaker is open (circuit_breaker.py)."""

    def __init__(self, inner: IndexReader, breaker: CircuitBreaker | None = None) -> None:
        self.inner = inner
        self.breaker = breaker or CircuitBreaker()

    async def lookup(self, mm_hashes: list[MmHash], block_hashes: list[BlockHash]) -> LookupResult:
        return await self._call(lambda: self.inner.lookup(mm_hashes, block_hashes))

    async def live_nodes(self) -> dict[str, NodeState]:
        return await self._call(self.inner.live_nodes)

    async def membership_changes(self, since: int) -> MembershipChanges | None:
        return await self._call(lambda: self.inner.membership_changes(since))

    async def close(self) -> None:
        await self.inner.close()

    async def _call(self, call: Callable[[], Awaitable[T]]) -> T:
        self.breaker.check()
        try:
            result = await call()
        except BaseException as exc:
            self.breaker.record(exc)
            raise
        self.breaker.record(None)
        return result


def create_reader(
    url: str,
    *,
    namespace: str,
    credentials: IndexCredentials | None = None,
    record_key: bytes | None = None,
    record_max_skew_s: float = DEFAULT_MAX_SKEW_S,
) -> IndexReader:
    """The reader of the index at ``url`` (the URLs create_index takes). A memory:// reader sees
    an in-process index of its own, which no other process writes."""
    if url.startswith("memory://"):
        from shared.index.memory_backend import InProcessIndex

        return _sealed(LocalReader(InProcessIndex(namespace=namespace)), record_key, namespace, record_max_skew_s)
    if url.startswith(("redis://", "rediss://", "unix://")):
        from shared.index.redis_reader import RedisReader

        redis_reader = RedisReader(url, namespace=namespace, credentials=credentials or IndexCredentials())
        return BreakerReader(_sealed(redis_reader, record_key, namespace, record_max_skew_s))
    raise ValueError(f"unsupported index URL {url!r}: use memory:// or redis://host:port/db")


def _sealed(reader: IndexReader, record_key: bytes | None, namespace: str, max_skew_s: float) -> IndexReader:
    return reader if record_key is None else SealedReader(reader, RecordSealer(record_key, namespace, max_skew_s=max_skew_s))
