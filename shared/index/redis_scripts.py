"""The Lua scripts of the Redis / Valkey index backend (redis_backend.py has the key layout).
Each runs atomically on the server. Node records carry their cluster settings as "cfg:{setting}"
fields, and the scripts that hand records out serve only those agreeing with "P config"
(shared/index/cluster_config.py)."""

from __future__ import annotations

from shared.index.types import MEMBER_LOG_LENGTH, NO_STATE_MARK

# Lua helpers prepended to the scripts that use them. agrees: whether a node record's settings
# agree with the cluster's record (read once per script run); extend: keep the cluster's record
# alive for at least ttl_ms (PTTL -1: just created, no expiry yet; -2: there is none).
AGREES = """
local agreed = nil
local function agrees(prefix, state)
  if agreed == nil then
    agreed = {}
    local fields = redis.call('HGETALL', prefix .. 'config')
    for i = 1, #fields, 2 do agreed[fields[i]] = fields[i + 1] end
  end
  for name, value in pairs(agreed) do
    local mine = state['cfg:' .. name]
    if mine and mine ~= value then return false end
  end
  return true
end
"""
# log_change: bump the membership version and log which node it was for, in "P member_log"
# (a sorted set of "{version}|{node}" scored by version, its latest MEMBER_LOG_LENGTH kept).
# A new (or restarted, emptied) index starts counting at the server's clock in microseconds, so
# its versions lie above every version an earlier incarnation handed out: a reader that knew one
# never mistakes the new log for a continuation of the old (CHANGES_SCRIPT then asks for a
# listing). Versions stay below 2^53, exact as Lua numbers and ZSET scores, but Lua's own
# number-to-text is 14 digits: versions travel as strings ('%.0f'), never by concatenation.
LOG_CHANGE = f"""
local function log_change(members, log, id)
  if redis.call('EXISTS', members) == 0 then
    local now = redis.call('TIME')
    redis.call('SET', members, now[1] .. string.format('%06d', tonumber(now[2])))
  end
  local version = string.format('%.0f', redis.call('INCR', members))
  redis.call('ZADD', log, version, version .. '|' .. id)
  redis.call('ZREMRANGEBYRANK', log, 0, -{MEMBER_LOG_LENGTH + 1})
end
"""
EXTEND = """
local function extend(key, ttl_ms)
  local left = redis.call('PTTL', key)
  if left == -1 or (left >= 0 and left < tonumber(ttl_ms)) then redis.call('PEXPIRE', key, ttl_ms) end
end
"""

# ARGV[1]: key prefix; ARGV[2]: JSON [[mm_hash...], [block_hash...]]; ARGV[3]: the holders a key
# may name (types.MAX_HOLDERS_PER_KEY).
# Returns JSON {"nodes": {id: epoch}, "mm": {mm_hash: {node: value}}, "prefix": {node: blocks},
# "version": members} with current-epoch entries of live nodes only, "nodes" naming the nodes in
# the answer with their epochs. JSON both ways because redis-py's RESP packer and parser are pure
# Python, paying per argument and per reply element, while cjson on the server and json in the
# client are C: a 256-block request is one argument, and the reply one string.
# A holder's epoch field is read the first time the answer names it: no field, no live record;
# an entry counts only when it carries that epoch. Not its whole record: the records, their
# seals and their cluster settings are the membership's to check (live_nodes, at once when
# "version" moves), and the gateway credits a name only while its membership holds that node
# under that epoch. One field per holder keeps the server's work and the reply small.
# A node's "prefix" ends at its last block, within the blocks it holds from block 0, whose entry
# lacks NO_STATE_MARK (types.is_resumable): a hybrid node resumes only where it kept the state.
#
# Bounded fan-out. A key with more than ARGV[3] holders (a hot image, a hot prefix's first
# blocks: every node that served it) names a random ARGV[3] of them (HRANDFIELD), so a lookup
# costs O(images + blocks) times that bound, whatever the cluster's size:
#   - images: each image's holders, sampled past the bound;
#   - prefix, block 0 with at most the bound's holders: the exact walk, as the Protocol states it
#     (block 0's holders, then HMGET of the nodes still matching, block by block, until none is
#     left): every holder of a prefix is named with its length;
#   - prefix, block 0 with more: the deepest block with any entry is found by binary search over
#     the blocks (HLEN: holding block i nearly always means holding the blocks before it, as
#     they are chained), and the same walk from block 0 runs over that block's live holders
#     (sampled past the bound) only; over block 0's sample instead when none of them is live or
#     holds block 0 (a dead node's entries, an evicted head). Named: the holders of the longest
#     prefix found, each with its exact length; a node holding only a shorter hot prefix is not.
#     Holders read: at most the bound per image and two samples, whatever the cluster's size.
LOOKUP_SCRIPT = (
    f"local NO_STATE, NO_STATE_LEN = '{NO_STATE_MARK}', {len(NO_STATE_MARK)}"
    + """
local call, find, sub = redis.call, string.find, string.sub
local prefix = ARGV[1]
local request = cjson.decode(ARGV[2])
local bound = tonumber(ARGV[3])
local tags = {}  -- holder -> "{epoch}|", the start of every entry written under its epoch; false: not live
local nodes = {}  -- the holders named -> their epoch
local function tag_of(id)
  local tag = tags[id]
  if tag == nil then
    -- No epoch: no live registration (the record expired, or a heartbeat raced its expiry).
    local epoch = call('HGET', prefix .. 'node:' .. id, 'epoch')
    if epoch then
      nodes[id] = tonumber(epoch)
      tag = epoch .. '|'
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
-- A key's live holders -> their entries, and whether they were sampled (more than the bound).
local function holders_of(key)
  local entries, sampled
  if call('HLEN', key) > bound then
    entries, sampled = call('HRANDFIELD', key, bound, 'WITHVALUES'), true
  else
    entries, sampled = call('HGETALL', key), false
  end
  local live, ids = {}, {}
  for j = 1, #entries, 2 do
    if current(entries[j], entries[j + 1]) then
      live[entries[j]] = entries[j + 1]
      ids[#ids + 1] = entries[j]
    end
  end
  return live, ids, sampled
end
local mm = {}
for _, mm_hash in ipairs(request[1]) do
  mm[mm_hash] = holders_of(prefix .. 'mm:' .. mm_hash)
end
local kv = prefix .. 'kv:'
local blocks = request[2]
local ends = {}  -- node -> the blocks up to the last one it can resume after, within its prefix
local function resumable(value) return sub(value, -NO_STATE_LEN) ~= NO_STATE end
-- From block ``from`` on, with ``matching`` live nodes known to hold the blocks before it: each
-- node's end moves to every block it holds, while it holds them all, that it can resume after.
local function walk(matching, from)
  for i = from, #blocks do
    if #matching == 0 then break end
    local values = call('HMGET', kv .. blocks[i], unpack(matching))
    local still = {}
    for j = 1, #matching do
      if current(matching[j], values[j]) then
        still[#still + 1] = matching[j]
        if resumable(values[j]) then ends[matching[j]] = i end
      end
    end
    matching = still
  end
end
-- The walk from block 2 over block 1's live holders, whose block-1 entries are already read.
local function walk_from_second(live, first)
  for id, value in pairs(live) do
    if resumable(value) then ends[id] = 1 end
  end
  walk(first, 2)
end
if #blocks > 0 then
  local live, first, sampled = holders_of(kv .. blocks[1])
  if not sampled then
    walk_from_second(live, first)
  else
    local lo, hi = 1, #blocks
    while lo < hi do
      local mid = math.floor((lo + hi + 1) / 2)
      if call('HLEN', kv .. blocks[mid]) > 0 then lo = mid else hi = mid - 1 end
    end
    local _, deepest = holders_of(kv .. blocks[lo])
    walk(#deepest > 0 and deepest or first, 1)
    -- As the in-process backend: block 0's sample when the deepest's holders resume nowhere.
    if next(ends) == nil then walk_from_second(live, first) end
  end
end
return cjson.encode({nodes = nodes, mm = mm, prefix = ends, version = call('GET', prefix .. 'members') or '0'})
"""
)


# KEYS: epoch key, node key, cluster config, members version, member log; ARGV: epoch, load,
# kv_usage, ttl_ms, seal, adapters, node id. A change of adapters is logged as a membership change,
# so readers pick it up at their next lookup. Check and refresh in one atomic
# step: refreshing a node key that expired after a separate check would recreate it without its
# registration fields, a node no lookup can see and whose heartbeats keep succeeding. A record
# whose epoch field is not the node's (rewritten by someone else) fails too: the node registers
# again, rather than re-seal fields it did not write. A live node keeps its cluster's config alive.
HEARTBEAT_SCRIPT = (
    EXTEND
    + LOG_CHANGE
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] or redis.call('HGET', KEYS[2], 'epoch') ~= ARGV[1] then return 0 end
local changed = (redis.call('HGET', KEYS[2], 'adapters') or '') ~= ARGV[6]
redis.call('HSET', KEYS[2], 'load', ARGV[2], 'kv_usage', ARGV[3], 'seal', ARGV[5], 'adapters', ARGV[6])
if changed then log_change(KEYS[4], KEYS[5], ARGV[7]) end
redis.call('PEXPIRE', KEYS[2], ARGV[4])
extend(KEYS[3], ARGV[4])
return 1
"""
)


# KEYS: epochs counter, epoch key, node key, nodes set, members version, cluster config, member
# log; ARGV:
# role, grpc, data, ttl_ms, node id, encodes, epoch, seal, then the node's settings as name, value
# pairs. An empty epoch takes the next one here; a sealed record comes with the epoch its seal
# covers, reserved beforehand from the same counter (RedisIndex.register_node). Settings that
# disagree with the cluster's refuse the node, writing nothing: {0, the cluster's record as
# name, value pairs}; else its settings fill in the ones the record lacks, and {epoch}.
# One atomic step, so a concurrent prune never sees the node half-registered, and two first
# registrants cannot both write the cluster's settings.
REGISTER_SCRIPT = (
    EXTEND
    + LOG_CHANGE
    + """
local agreed = redis.call('HGETALL', KEYS[6])
local cluster = {}
for i = 1, #agreed, 2 do cluster[agreed[i]] = agreed[i + 1] end
for i = 9, #ARGV, 2 do
  if cluster[ARGV[i]] and cluster[ARGV[i]] ~= ARGV[i + 1] then return {0, unpack(agreed)} end
end
local epoch = ARGV[7]
if epoch == '' then epoch = redis.call('INCR', KEYS[1]) end
redis.call('SET', KEYS[2], epoch)
redis.call('DEL', KEYS[3])
redis.call('HSET', KEYS[3], 'role', ARGV[1], 'grpc', ARGV[2], 'data', ARGV[3], 'encodes', ARGV[6], 'epoch', epoch,
  'load', 0, 'kv_usage', 0, 'seal', ARGV[8])
for i = 9, #ARGV, 2 do
  redis.call('HSET', KEYS[3], 'cfg:' .. ARGV[i], ARGV[i + 1])
  redis.call('HSETNX', KEYS[6], ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', KEYS[3], ARGV[4])
extend(KEYS[6], ARGV[4])
redis.call('SADD', KEYS[4], ARGV[5])
log_change(KEYS[5], KEYS[7], ARGV[5])
return {tonumber(epoch)}
"""
)

# KEYS: epoch key, node key, nodes set, members version, member log; ARGV: epoch, node id. Only
# the current incarnation may deregister: a restarted node's registration must survive its
# predecessor's late drain.
DEREGISTER_SCRIPT = (
    LOG_CHANGE
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('SREM', KEYS[3], ARGV[2])
log_change(KEYS[4], KEYS[5], ARGV[2])
return 1
"""
)

# ARGV[1]: key prefix. Returns JSON {id: fields} of live nodes agreeing with the cluster's
# settings; forgets lapsed ones.
LIVE_NODES_SCRIPT = (
    AGREES
    + LOG_CHANGE
    + """
local call, prefix = redis.call, ARGV[1]
local nodes = {}
for _, id in ipairs(call('SMEMBERS', prefix .. 'nodes')) do
  local fields = call('HGETALL', prefix .. 'node:' .. id)
  local state = {}
  for i = 1, #fields, 2 do state[fields[i]] = fields[i + 1] end
  if state['epoch'] then
    if agrees(prefix, state) then nodes[id] = state end
  elseif #fields == 0 then
    call('SREM', prefix .. 'nodes', id)
    call('DEL', prefix .. 'epoch:' .. id)
    log_change(prefix .. 'members', prefix .. 'member_log', id)
  end
end
return cjson.encode(nodes)
"""
)

# ARGV[1]: key prefix; ARGV[2]: the membership version the reader knows. Returns JSON {"version":
# members, "nodes": {id: fields}, "gone": [id...]} for the nodes logged after that version, each
# record read once (live and agreeing: in "nodes"; else "gone"); or false when the log does not
# reach back to it (trimmed, or a version of an earlier incarnation of the index): list instead.
CHANGES_SCRIPT = (
    AGREES
    + """
local call, prefix, since = redis.call, ARGV[1], tonumber(ARGV[2])
local current = call('GET', prefix .. 'members') or '0'
local version = tonumber(current)
if version < since then return false end
local nodes, gone, seen = {}, {}, {}
if version > since then
  local oldest = call('ZRANGE', prefix .. 'member_log', 0, 0, 'WITHSCORES')
  if #oldest == 0 or tonumber(oldest[2]) > since + 1 then return false end
  for _, entry in ipairs(call('ZRANGEBYSCORE', prefix .. 'member_log', '(' .. ARGV[2], '+inf')) do
    local id = string.sub(entry, string.find(entry, '|', 1, true) + 1)
    if not seen[id] then
      seen[id] = true
      local fields = call('HGETALL', prefix .. 'node:' .. id)
      local state = {}
      for i = 1, #fields, 2 do state[fields[i]] = fields[i + 1] end
      if state['epoch'] and agrees(prefix, state) then nodes[id] = state else gone[#gone + 1] = id end
    end
  end
end
return cjson.encode({version = current, nodes = nodes, gone = gone})
"""
)
