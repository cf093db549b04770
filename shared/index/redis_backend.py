"""Redis / Valkey index backend.

Key layout, under the namespace prefix P = "tessera:{namespace}:":
  P epochs            INTEGER  the last epoch handed out, to any node (INCR on registration)
  P epoch:{node}      INTEGER  the node's current epoch
  P node:{node}       HASH     role, grpc, data, encodes ("1": a prefill node that can run the
                               vision tower itself), epoch, load, kv_usage, seal (empty: unsealed;
                               shared/index/record_seal.py); expires after the TTL
  P nodes             SET      registered node ids (live_nodes skips those whose key expired,
                               and prunes them with their epoch key)
  P members           INTEGER  membership version: bumped by every registration, deregistration
                               and prune, so a reader knows when to list the nodes again
Epochs come from one counter for all nodes, so a node id registered again after its records were
pruned still gets an epoch its old entries never carried.
  P mm:{mm_hash}      HASH     node -> "{epoch}|{num_tokens}|{t},{h},{w}|{bytes}"
  P kv:{block_hash}   HASH     node -> "{epoch}|{tier}"
Entry keys expire ENTRY_TTL_S after their last write, so a node that vanished for good leaves
nothing behind for long; liveness and epoch checks make such leftovers harmless meanwhile.
Writes are one MULTI/EXEC transaction per batch; a lookup is one EVALSHA of LOOKUP_SCRIPT, which
filters by liveness and epoch on the server and returns each live node's leading-block count,
reading only the records of the nodes it names.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import redis
from redis.connection import Encoder, PythonRespSerializer

from shared.index.backend import IndexCredentials
from shared.index.types import IndexEvents, IndexUnavailableError, LookupResult, MmEntry, NodeInfo, NodeState
from shared.types import BlockHash, MmHash

ENTRY_TTL_S = 3600

# ARGV[1]: key prefix; ARGV[2]: JSON [[mm_hash...], [block_hash...]].
# Returns JSON {"nodes": {id: fields}, "mm": {mm_hash: {node: value}}, "prefix": {node: blocks},
# "version": members} with current-epoch entries of live nodes only, "nodes" holding the records
# of the nodes named in the answer. JSON both ways because redis-py's pure-Python RESP packer and
# parser cost ~2 us per argument or reply element, while cjson on the server and json in the
# client are C: a 256-block request is one argument, and the reply one string.
# Cost: O(images + blocks walked + distinct holders), never O(nodes): a holder's record is read
# the first time the answer names it, to check that it is live and that the entry carries its
# current epoch. The membership itself (every node, with its load) is the gateway's, refreshed
# by live_nodes and at once when "version" moves.
# The block walk reads block 0's holders, then asks only for the nodes still matching (HMGET),
# and stops when none is left: the server reads at most the longest cached prefix, and the reply
# carries one count per node instead of a holder list per block.
LOOKUP_SCRIPT = """
local call, find = redis.call, string.find
local prefix = ARGV[1]
local request = cjson.decode(ARGV[2])
local tags = {}  -- holder -> "{epoch}|", the start of every entry written under its epoch; false: not live
local nodes = {}
local function tag_of(id)
  local tag = tags[id]
  if tag == nil then
    local fields = call('HGETALL', prefix .. 'node:' .. id)
    local state = {}
    for i = 1, #fields, 2 do state[fields[i]] = fields[i + 1] end
    -- No epoch: not a registration (a heartbeat that raced the key's expiry); not live.
    if state['epoch'] then
      nodes[id] = state
      tag = state['epoch'] .. '|'
    else
      tag = false
    end
    tags[id] = tag
  end
  return tag
end
local function current(node, value)
  if value == false then return false end
  local tag = tag_of(node)
  return tag ~= false and find(value, tag, 1, true) == 1
end
local mm = {}
for _, mm_hash in ipairs(request[1]) do
  local holders = {}
  local entries = call('HGETALL', prefix .. 'mm:' .. mm_hash)
  for j = 1, #entries, 2 do
    if current(entries[j], entries[j + 1]) then holders[entries[j]] = entries[j + 1] end
  end
  mm[mm_hash] = holders
end
local kv = prefix .. 'kv:'
local blocks = request[2]
local counts = {}
local matching = {}  -- live nodes holding every block so far
if #blocks > 0 then
  local entries = call('HGETALL', kv .. blocks[1])
  for j = 1, #entries, 2 do
    if current(entries[j], entries[j + 1]) then matching[#matching + 1] = entries[j] end
  end
end
local held = #matching > 0 and 1 or 0  -- blocks the still-matching nodes hold
for i = 2, #blocks do
  if #matching == 0 then break end
  local values = call('HMGET', kv .. blocks[i], unpack(matching))
  local all = true
  for j = 1, #matching do
    if not current(matching[j], values[j]) then all = false break end
  end
  if not all then  -- rare: a node's prefix ends here; rebuild the list without it
    local still = {}
    for j = 1, #matching do
      if current(matching[j], values[j]) then still[#still + 1] = matching[j] else counts[matching[j]] = i - 1 end
    end
    matching = still
  end
  if #matching > 0 then held = i end
end
for _, node in ipairs(matching) do counts[node] = held end
return cjson.encode({nodes = nodes, mm = mm, prefix = counts, version = tonumber(call('GET', prefix .. 'members')) or 0})
"""


# KEYS: epoch key, node key; ARGV: epoch, load, kv_usage, ttl_ms, seal. Check and refresh in one atomic
# step: refreshing a node key that expired after a separate check would recreate it without its
# registration fields, a node no lookup can see and whose heartbeats keep succeeding. A record
# whose epoch field is not the node's (rewritten by someone else) fails too: the node registers
# again, rather than re-seal fields it did not write.
HEARTBEAT_SCRIPT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] or redis.call('HGET', KEYS[2], 'epoch') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[2], 'load', ARGV[2], 'kv_usage', ARGV[3], 'seal', ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
"""


# KEYS: epochs counter, epoch key, node key, nodes set, members version; ARGV: role, grpc, data,
# ttl_ms, node id, encodes, epoch, seal. An empty epoch takes the next one here; a sealed record comes with the
# epoch its seal covers, reserved beforehand from the same counter (RedisIndex.register_node).
# One atomic step, so a concurrent prune never sees the node half-registered.
REGISTER_SCRIPT = """
local epoch = ARGV[7]
if epoch == '' then epoch = redis.call('INCR', KEYS[1]) end
redis.call('SET', KEYS[2], epoch)
redis.call('DEL', KEYS[3])
redis.call('HSET', KEYS[3], 'role', ARGV[1], 'grpc', ARGV[2], 'data', ARGV[3], 'encodes', ARGV[6], 'epoch', epoch,
  'load', 0, 'kv_usage', 0, 'seal', ARGV[8])
redis.call('PEXPIRE', KEYS[3], ARGV[4])
redis.call('SADD', KEYS[4], ARGV[5])
redis.call('INCR', KEYS[5])
return epoch
"""

# KEYS: epoch key, node key, nodes set, members version; ARGV: epoch, node id. Only the current
# incarnation may deregister: a restarted node's registration must survive its predecessor's late
# drain.
DEREGISTER_SCRIPT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('SREM', KEYS[3], ARGV[2])
redis.call('INCR', KEYS[4])
return 1
"""

# ARGV[1]: key prefix. Returns JSON {id: fields} of live nodes; forgets lapsed ones.
LIVE_NODES_SCRIPT = """
local call, prefix = redis.call, ARGV[1]
local nodes = {}
for _, id in ipairs(call('SMEMBERS', prefix .. 'nodes')) do
  local fields = call('HGETALL', prefix .. 'node:' .. id)
  local state = {}
  for i = 1, #fields, 2 do state[fields[i]] = fields[i + 1] end
  if state['epoch'] then
    nodes[id] = state
  elseif #fields == 0 then
    call('SREM', prefix .. 'nodes', id)
    call('DEL', prefix .. 'epoch:' .. id)
    call('INCR', prefix .. 'members')
  end
end
return cjson.encode(nodes)
"""


class _OneWritePacker(PythonRespSerializer):
    """redis-py's packer gives every argument over 6000 bytes its own socket write, so a lookup
    (16 KB of block hashes for a 4096-token prompt) took three writes, each able to wake the
    server on a partial command: on a busy host, extra context switches in the decision's tail.
    One buffer per command costs one copy."""

    def pack(self, *args) -> list[bytes]:
        return [b"".join(super().pack(*args))]


class RedisIndex:
    def __init__(self, url: str, *, namespace: str, credentials: IndexCredentials, timeout_s: float = 1.0) -> None:
        self.prefix = f"tessera:{namespace}:"
        packer = _OneWritePacker(6000, Encoder("utf-8", "strict", decode_responses=True).encode)
        tls = {"ssl_ca_certs": str(credentials.tls_ca)} if url.startswith("rediss://") and credentials.tls_ca is not None else {}
        self._client = redis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            decode_responses=True,
            command_packer=packer,
            **({"username": credentials.username} if credentials.username else {}),
            **({"password": credentials.password} if credentials.password else {}),
            **tls,
        )
        self._lookup = self._client.register_script(LOOKUP_SCRIPT)
        self._heartbeat = self._client.register_script(HEARTBEAT_SCRIPT)
        self._register = self._client.register_script(REGISTER_SCRIPT)
        self._deregister = self._client.register_script(DEREGISTER_SCRIPT)
        self._live_nodes = self._client.register_script(LIVE_NODES_SCRIPT)

    def register_node(self, node: NodeInfo, *, ttl_s: float, seal_fn: Callable[[int], str] | None = None) -> int:
        p = self.prefix
        keys = [p + "epochs", p + f"epoch:{node.node_id}", p + f"node:{node.node_id}", p + "nodes", p + "members"]
        try:
            epoch, seal = "", ""
            if seal_fn is not None:
                reserved = int(self._client.incr(p + "epochs"))
                epoch, seal = str(reserved), seal_fn(reserved)
            args = [node.role, node.grpc_address, node.data_address, int(ttl_s * 1000), node.node_id, int(node.can_encode), epoch, seal]
            return int(self._register(keys=keys, args=args))
        except redis.RedisError as exc:
            raise IndexUnavailableError(f"index unavailable: {exc}") from None

    def deregister_node(self, node_id: str, epoch: int) -> None:
        p = self.prefix
        try:
            self._deregister(keys=[p + f"epoch:{node_id}", p + f"node:{node_id}", p + "nodes", p + "members"], args=[epoch, node_id])
        except redis.RedisError as exc:
            raise IndexUnavailableError(f"index unavailable: {exc}") from None

    def live_nodes(self) -> dict[str, NodeState]:
        try:
            reply = json.loads(self._live_nodes(args=[self.prefix]))
        except redis.RedisError as exc:
            raise IndexUnavailableError(f"index unavailable: {exc}") from None
        return {node_id: _node_state(node_id, fields) for node_id, fields in reply.items()}

    def heartbeat(self, node_id: str, epoch: int, *, load: float, kv_usage: float, ttl_s: float, seal: str = "") -> bool:
        keys = [self.prefix + f"epoch:{node_id}", self.prefix + f"node:{node_id}"]
        try:
            # repr(float): the exact text a sealed record's reader re-derives (shared/index/record_seal.py).
            args = [epoch, repr(float(load)), repr(float(kv_usage)), int(ttl_s * 1000), seal]
            return self._heartbeat(keys=keys, args=args) == 1
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
            reply = json.loads(self._lookup(args=[self.prefix, json.dumps([mm_hashes, block_hashes])]))
        except redis.RedisError as exc:
            raise IndexUnavailableError(f"index unavailable: {exc}") from None
        nodes = {node_id: _node_state(node_id, fields) for node_id, fields in reply["nodes"].items()}
        mm_holders = {}
        for mm_hash in mm_hashes:
            holders = {}
            for node_id, value in reply["mm"].get(mm_hash, {}).items():
                _, num_tokens, grid, num_bytes = value.split("|")
                holders[node_id] = MmEntry(int(num_tokens), tuple(int(x) for x in grid.split(",")), int(num_bytes))
            mm_holders[mm_hash] = holders
        return LookupResult(
            nodes=nodes, mm_holders=mm_holders, node_to_num_prefix_blocks=reply["prefix"], membership_version=int(reply["version"])
        )

    def close(self) -> None:
        self._client.close()


def _node_state(node_id: str, fields: dict[str, str]) -> NodeState:
    info = NodeInfo(node_id, fields.get("role", ""), fields.get("grpc", ""), fields.get("data", ""), fields.get("encodes") == "1")
    return NodeState(info, int(fields["epoch"]), float(fields.get("load", 0)), float(fields.get("kv_usage", 0)), fields.get("seal", ""))
