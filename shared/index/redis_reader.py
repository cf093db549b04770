"""The Redis / Valkey index as a router reads it, through redis-py's asyncio client: a lookup or
a listing awaits its reply, so a slow or stopped server delays the route that asked (up to the
socket timeout, then IndexUnavailableError) and nothing else on the event loop. The scripts, key
layout and reply formats are the writer's (redis_backend.py, redis_scripts.py).
"""

from __future__ import annotations

import json

import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from shared.index.backend import IndexCredentials
from shared.index.redis_backend import client_options, live_nodes_of, lookup_args, lookup_result, membership_changes_of
from shared.index.redis_scripts import CHANGES_SCRIPT, LIVE_NODES_SCRIPT, LOOKUP_SCRIPT
from shared.index.types import IndexUnavailableError, LookupResult, MembershipChanges, NodeState
from shared.types import BlockHash, MmHash


class RedisReader:
    def __init__(self, url: str, *, namespace: str, credentials: IndexCredentials, timeout_s: float = 1.0) -> None:
        self.namespace = namespace
        self.prefix = f"tessera:{namespace}:"
        # A connection the server closed (a restart, an idle timeout) is found only when a read
        # fails: one retry on a new connection, as the blocking client's pool does by checking
        # first. Never on a timeout: a stalled server would cost the route twice the wait.
        retry = Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))
        self._client = redis.asyncio.Redis.from_url(url, retry=retry, **client_options(url, credentials, timeout_s))
        self._lookup = self._client.register_script(LOOKUP_SCRIPT)
        self._live_nodes = self._client.register_script(LIVE_NODES_SCRIPT)
        self._changes = self._client.register_script(CHANGES_SCRIPT)

    async def lookup(self, mm_hashes: list[MmHash], block_hashes: list[BlockHash]) -> LookupResult:
        try:
            reply = await self._lookup(args=lookup_args(self.prefix, mm_hashes, block_hashes))
        except redis.RedisError as exc:
            raise IndexUnavailableError(f"index unavailable: {exc}") from None
        return lookup_result(json.loads(reply), mm_hashes)

    async def live_nodes(self) -> dict[str, NodeState]:
        try:
            reply = await self._live_nodes(args=[self.prefix])
        except redis.RedisError as exc:
            raise IndexUnavailableError(f"index unavailable: {exc}") from None
        return live_nodes_of(json.loads(reply))

    async def membership_changes(self, since: int) -> MembershipChanges | None:
        try:
            raw = await self._changes(args=[self.prefix, since])
        except redis.RedisError as exc:
            raise IndexUnavailableError(f"index unavailable: {exc}") from None
        return None if raw is None else membership_changes_of(json.loads(raw))

    async def close(self) -> None:
        await self._client.aclose()
