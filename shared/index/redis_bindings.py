"""Uuid bindings on the index's Redis / Valkey server (the contract: shared/index/uuid_bindings.py).

Key layout, under the index's namespace prefix P = "tessera:{namespace}:":
  P uuid:{key}        STRING   the binding's JSON (ContentBinding); expires TTL after its last
                               bind or resolve
  P uuid_bindings     ZSET     binding keys scored by their expiry (server milliseconds): the
                               budget drops the ones closest to expiring, and lapsed members
                               are pruned on every bind
Each call is one script, so two nodes binding one uuid to different bytes at once cannot both
win: the second sees the first's binding and reports the conflict. Expiries use the server's
clock (TIME), so nodes with skewed clocks agree.
"""

from __future__ import annotations

import redis

from shared.index.backend import IndexCredentials
from shared.index.redis_backend import client_options
from shared.index.types import IndexUnavailableError
from shared.index.uuid_bindings import ContentBinding

_NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: binding key, budget zset. ARGV: binding JSON, TTL ms, max entries. -> the binding in force.
BIND_SCRIPT = (
    _NOW_MS
    + """
local ttl = tonumber(ARGV[2])
local in_force = redis.call('GET', KEYS[1]) or ARGV[1]
redis.call('SET', KEYS[1], in_force, 'PX', ttl)
redis.call('ZADD', KEYS[2], now + ttl, KEYS[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local excess = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[3])
if excess > 0 then
  local dropped = redis.call('ZPOPMIN', KEYS[2], excess)
  for i = 1, #dropped, 2 do redis.call('DEL', dropped[i]) end
end
redis.call('PEXPIRE', KEYS[2], ttl)
return in_force
"""
)

# KEYS: binding key, budget zset. ARGV: TTL ms. -> the live binding, refreshed, or nil.
RESOLVE_SCRIPT = (
    _NOW_MS
    + """
local current = redis.call('GET', KEYS[1])
if not current then return false end
local ttl = tonumber(ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[2], now + ttl, KEYS[1])
redis.call('PEXPIRE', KEYS[2], ttl)
return current
"""
)


class RedisBindings:
    def __init__(
        self, url: str, *, namespace: str, credentials: IndexCredentials, ttl_s: float, max_entries: int, timeout_s: float = 1.0
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.prefix = f"tessera:{namespace}:"
        self._client = redis.Redis.from_url(url, **client_options(url, credentials, timeout_s))
        self._bind = self._client.register_script(BIND_SCRIPT)
        self._resolve = self._client.register_script(RESOLVE_SCRIPT)

    def bind(self, key: str, binding: ContentBinding) -> ContentBinding:
        reply = self._call(self._bind, key, binding.to_json(), self._ttl_ms(), self.max_entries)
        return ContentBinding.from_json(reply)

    def resolve(self, key: str) -> ContentBinding | None:
        reply = self._call(self._resolve, key, self._ttl_ms())
        return ContentBinding.from_json(reply) if reply else None

    def close(self) -> None:
        self._client.close()

    def _ttl_ms(self) -> int:
        return max(1, round(self.ttl_s * 1000))

    def _call(self, script, key: str, *args):
        try:
            return script(keys=[self.prefix + "uuid:" + key, self.prefix + "uuid_bindings"], args=list(args))
        except redis.RedisError as exc:
            raise IndexUnavailableError(f"uuid bindings unavailable: {exc}") from exc
