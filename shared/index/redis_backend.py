"""Redis / Valkey index backend.

Key layout, under the namespace prefix P = "tessera:{namespace}:":
  P epoch:{node}      INTEGER  the node's current epoch (INCR on registration)
  P node:{node}       HASH     role, grpc, data, epoch, load, kv_usage; expires after the TTL
  P nodes             SET      node ids ever registered (lookup skips those whose key expired)
  P mm:{mm_hash}      HASH     node -> "{epoch}|{num_tokens}|{t},{h},{w}|{bytes}"
  P kv:{block_hash}   HASH     node -> "{epoch}|{tier}"
Entry keys expire ENTRY_TTL_S after their last write, so a node that vanished for good leaves
nothing behind for long; liveness and epoch checks make such leftovers harmless meanwhile.
Writes are one MULTI/EXEC transaction per batch; a lookup is one EVALSHA of LOOKUP_SCRIPT, which
filters by liveness and epoch on the server and stops the block walk at the first miss.
"""

from __future__ import annotations

import redis

from shared.index.types import IndexEvents, IndexUnavailableError, LookupResult, MmEntry, NodeInfo, NodeState
from shared.types import BlockHash, MmHash

ENTRY_TTL_S = 3600

# ARGV: prefix, num_mm, mm_hash..., block_hash...
# Returns {nodes_flat, mm_results, block_results}; nodes_flat is [id, fields...] per live node.
LOOKUP_SCRIPT = """
local prefix = ARGV[1]
local num_mm = tonumber(ARGV[2])
local live = {}
local nodes = {}
for _, id in ipairs(redis.call('SMEMBERS', prefix .. 'nodes')) do
  local fields = redis.call('HGETALL', prefix .. 'node:' .. id)
  if #fields > 0 then
    local state = {}
    for i = 1, #fields, 2 do state[fields[i]] = fields[i + 1] end
    live[id] = state['epoch']
    table.insert(nodes, {id, fields})
  end
end
local function filtered(key)
  local out = {}
  local entries = redis.call('HGETALL', key)
  for i = 1, #entries, 2 do
    local node, value = entries[i], entries[i + 1]
    local epoch = string.match(value, '^([^|]+)|')
    if live[node] ~= nil and live[node] == epoch then
      table.insert(out, node)
      table.insert(out, value)
    end
  end
  return out
end
local mm = {}
for i = 1, num_mm do
  table.insert(mm, filtered(prefix .. 'mm:' .. ARGV[2 + i]))
end
local blocks = {}
for i = 3 + num_mm, #ARGV do
  local holders = filtered(prefix .. 'kv:' .. ARGV[i])
  if #holders == 0 then break end
  table.insert(blocks, holders)
end
return {nodes, mm, blocks}
"""


class RedisIndex:
    def __init__(self, url: str, *, namespace: str, timeout_s: float = 1.0) -> None:
        self.prefix = f"tessera:{namespace}:"
        self._client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, decode_responses=True)
        self._lookup = self._client.register_script(LOOKUP_SCRIPT)

    def register_node(self, node: NodeInfo, *, ttl_s: float) -> int:
        try:
            epoch = int(self._client.incr(self.prefix + f"epoch:{node.node_id}"))
            key = self.prefix + f"node:{node.node_id}"
            with self._client.pipeline(transaction=True) as pipe:
                pipe.delete(key)
                pipe.hset(key, mapping={"role": node.role, "grpc": node.grpc_address, "data": node.data_address, "epoch": epoch, "load": 0, "kv_usage": 0})
                pipe.pexpire(key, int(ttl_s * 1000))
                pipe.sadd(self.prefix + "nodes", node.node_id)
                pipe.execute()
            return epoch
        except redis.RedisError as exc:
            raise IndexUnavailableError(f"index unavailable: {exc}") from None

    def heartbeat(self, node_id: str, epoch: int, *, load: float, kv_usage: float, ttl_s: float) -> bool:
        key = self.prefix + f"node:{node_id}"
        try:
            if self._client.get(self.prefix + f"epoch:{node_id}") != str(epoch) or not self._client.exists(key):
                return False
            with self._client.pipeline(transaction=True) as pipe:
                pipe.hset(key, mapping={"load": load, "kv_usage": kv_usage})
                pipe.pexpire(key, int(ttl_s * 1000))
                pipe.execute()
            return True
        except redis.RedisError as exc:
            raise IndexUnavailableError(f"index unavailable: {exc}") from None

    def publish(self, node_id: str, epoch: int, events: IndexEvents) -> None:
        if events.is_empty():
            return
        p = self.prefix
        try:
            with self._client.pipeline(transaction=True) as pipe:
                for mm_hash, entry in events.mm_stored.items():
                    grid = ",".join(str(x) for x in entry.grid_thw)
                    pipe.hset(p + f"mm:{mm_hash}", node_id, f"{epoch}|{entry.num_tokens}|{grid}|{entry.num_bytes}")
                    pipe.expire(p + f"mm:{mm_hash}", ENTRY_TTL_S)
                for mm_hash in events.mm_evicted:
                    pipe.hdel(p + f"mm:{mm_hash}", node_id)
                for block_hash, tier in events.kv_stored.items():
                    pipe.hset(p + f"kv:{block_hash}", node_id, f"{epoch}|{tier}")
                    pipe.expire(p + f"kv:{block_hash}", ENTRY_TTL_S)
                for block_hash in events.kv_evicted:
                    pipe.hdel(p + f"kv:{block_hash}", node_id)
                pipe.execute()
        except redis.RedisError as exc:
            raise IndexUnavailableError(f"index unavailable: {exc}") from None

    def lookup(self, mm_hashes: list[MmHash], block_hashes: list[BlockHash]) -> LookupResult:
        try:
            raw_nodes, raw_mm, raw_blocks = self._lookup(args=[self.prefix, len(mm_hashes), *mm_hashes, *block_hashes])
        except redis.RedisError as exc:
            raise IndexUnavailableError(f"index unavailable: {exc}") from None
        nodes = {}
        for node_id, flat in raw_nodes:
            fields = dict(zip(flat[::2], flat[1::2]))
            info = NodeInfo(node_id, fields.get("role", ""), fields.get("grpc", ""), fields.get("data", ""))
            nodes[node_id] = NodeState(info, int(fields["epoch"]), float(fields.get("load", 0)), float(fields.get("kv_usage", 0)))
        mm_holders = {}
        for mm_hash, flat in zip(mm_hashes, raw_mm):
            holders = {}
            for node_id, value in zip(flat[::2], flat[1::2]):
                _, num_tokens, grid, num_bytes = value.split("|")
                holders[node_id] = MmEntry(int(num_tokens), tuple(int(x) for x in grid.split(",")), int(num_bytes))
            mm_holders[mm_hash] = holders
        block_holders = [frozenset(flat[::2]) for flat in raw_blocks]
        return LookupResult(nodes=nodes, mm_holders=mm_holders, block_holders=block_holders)

    def close(self) -> None:
        self._client.close()
