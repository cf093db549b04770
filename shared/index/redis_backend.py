"""Redis / Valkey index backend.

Key layout, under the namespace prefix P = "tessera:{namespace}:":
  P epochs            INTEGER  the last epoch handed out, to any node (INCR on registration)
  P epoch:{node}      INTEGER  the node's current epoch
  P node:{node}       HASH     role, grpc, data, encodes ("1": a prefill node that can run the
                               vision tower itself), epoch, load, kv_usage, adapters (the LoRA
                               fingerprints it serves, comma-joined), seal (empty: unsealed;
                               shared/index/record_seal.py), cfg:{setting} for each cluster setting
                               it gave; expires after the TTL
  P nodes             SET      registered node ids (live_nodes skips those whose key expired,
                               and prunes them with their epoch key)
  P members           INTEGER  membership version: bumped by every registration, deregistration,
                               prune and change of a node's adapters, so a reader knows when to
                               list the nodes again
  P member_log        ZSET     "{version}|{node}" scored by version: which node each bump was
                               for, the latest MEMBER_LOG_LENGTH kept (membership_changes)
  P config            HASH     the cluster's settings, setting -> value, agreed at registration
                               (shared/index/cluster_config.py); expires a TTL after the last
                               registration or heartbeat
Epochs come from one counter for all nodes, so a node id registered again after its records were
pruned still gets an epoch its old entries never carried.
  P mm:{mm_hash}      HASH     node -> "{epoch}|{num_tokens}|{t},{h},{w}|{bytes}"
  P kv:{block_hash}   HASH     node -> "{epoch}|{tier}"
Entry keys expire ENTRY_TTL_S after their last write, so a node that vanished for good leaves
nothing behind for long; liveness and epoch checks make such leftovers harmless meanwhile.
Writes are one MULTI/EXEC transaction per batch; a lookup is one EVALSHA of LOOKUP_SCRIPT
(redis_scripts.py, with every script), which filters by liveness and epoch on the server and
returns each live node's leading-block count, reading only the epochs of the nodes it names.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import redis

from shared.index.backend import IndexCredentials
from shared.index.cluster_config import ClusterConfig, ConfigMismatchError, disagreements
from shared.index.redis_scripts import (
    CHANGES_SCRIPT,
    DEREGISTER_SCRIPT,
    HEARTBEAT_SCRIPT,
    LIVE_NODES_SCRIPT,
    LOOKUP_SCRIPT,
    REGISTER_SCRIPT,
)
from shared.index.types import (
    MAX_HOLDERS_PER_KEY,
    IndexEvents,
    IndexUnavailableError,
    LookupResult,
    MembershipChanges,
    MmEntry,
    NodeInfo,
    NodeState,
    adapters_field,
    adapters_of,
)
from shared.types import BlockHash, MmHash

ENTRY_TTL_S = 3600


class RedisIndex:
    def __init__(self, url: str, *, namespace: str, credentials: IndexCredentials, timeout_s: float = 1.0) -> None:
        self.namespace = namespace
        self.prefix = f"tessera:{namespace}:"
        self._client = redis.Redis.from_url(url, **client_options(url, credentials, timeout_s))
        self._lookup = self._client.register_script(LOOKUP_SCRIPT)
        self._heartbeat = self._client.register_script(HEARTBEAT_SCRIPT)
        self._register = self._client.register_script(REGISTER_SCRIPT)
        self._deregister = self._client.register_script(DEREGISTER_SCRIPT)
        self._live_nodes = self._client.register_script(LIVE_NODES_SCRIPT)
        self._changes = self._client.register_script(CHANGES_SCRIPT)

    def register_node(self, node: NodeInfo, *, ttl_s: float, seal_fn: Callable[[int], str] | None = None) -> int:
        p = self.prefix
        keys = [p + "epochs", p + f"epoch:{node.node_id}", p + f"node:{node.node_id}", p + "nodes", p + "members", p + "config"]
        keys.append(p + "member_log")
        settings = node.config.settings()
        try:
            epoch, seal = "", ""
            if seal_fn is not None:
                reserved = int(self._client.incr(p + "epochs"))
                epoch, seal = str(reserved), seal_fn(reserved)
            args = [node.role, node.grpc_address, node.data_address, int(ttl_s * 1000), node.node_id, int(node.can_encode), epoch, seal]
            reply = self._register(keys=keys, args=[*args, *(x for pair in settings.items() for x in pair)])
        except redis.RedisError as exc:
            raise IndexUnavailableError(f"index unavailable: {exc}") from None
        if int(reply[0]) == 0:  # refused: the rest is the cluster's record
            agreed = dict(zip(reply[1::2], reply[2::2], strict=True))
            raise ConfigMismatchError(self.namespace, node.node_id, disagreements(settings, agreed))
        return int(reply[0])

    def deregister_node(self, node_id: str, epoch: int) -> None:
        p = self.prefix
        try:
            keys = [p + f"epoch:{node_id}", p + f"node:{node_id}", p + "nodes", p + "members", p + "member_log"]
            self._deregister(keys=keys, args=[epoch, node_id])
        except redis.RedisError as exc:
            raise IndexUnavailableError(f"index unavailable: {exc}") from None

    def live_nodes(self) -> dict[str, NodeState]:
        try:
            reply = json.loads(self._live_nodes(args=[self.prefix]))
        except redis.RedisError as exc:
            raise IndexUnavailableError(f"index unavailable: {exc}") from None
        return live_nodes_of(reply)

    def membership_changes(self, since: int) -> MembershipChanges | None:
        try:
            raw = self._changes(args=[self.prefix, since])
        except redis.RedisError as exc:
            raise IndexUnavailableError(f"index unavailable: {exc}") from None
        return None if raw is None else membership_changes_of(json.loads(raw))

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
        p = self.prefix
        keys = [p + f"epoch:{node_id}", p + f"node:{node_id}", p + "config", p + "members", p + "member_log"]
        try:
            # repr(float): the exact text a sealed record's reader re-derives (shared/index/record_seal.py).
            args = [epoch, repr(float(load)), repr(float(kv_usage)), int(ttl_s * 1000), seal, adapters_field(adapters), node_id]
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
            reply = self._lookup(args=lookup_args(self.prefix, mm_hashes, block_hashes))
        except redis.RedisError as exc:
            raise IndexUnavailableError(f"index unavailable: {exc}") from None
        return lookup_result(json.loads(reply), mm_hashes)

    def close(self) -> None:
        self._client.close()


def client_options(url: str, credentials: IndexCredentials, timeout_s: float) -> dict:
    """redis-py's client options (the same for its asyncio client): timeouts, credentials, TLS."""
    tls = {"ssl_ca_certs": str(credentials.tls_ca)} if url.startswith("rediss://") and credentials.tls_ca is not None else {}
    return {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "decode_responses": True,
        **({"username": credentials.username} if credentials.username else {}),
        **({"password": credentials.password} if credentials.password else {}),
        **tls,
    }


def lookup_args(prefix: str, mm_hashes: list[MmHash], block_hashes: list[BlockHash]) -> list:
    return [prefix, json.dumps([mm_hashes, block_hashes]), MAX_HOLDERS_PER_KEY]


def lookup_result(reply: dict, mm_hashes: list[MmHash]) -> LookupResult:
    """LOOKUP_SCRIPT's decoded reply."""
    mm_holders = {}
    for mm_hash in mm_hashes:
        holders = {}
        for node_id, value in reply["mm"].get(mm_hash, {}).items():
            _, num_tokens, grid, num_bytes = value.split("|")
            holders[node_id] = MmEntry(int(num_tokens), tuple(int(x) for x in grid.split(",")), int(num_bytes))
        mm_holders[mm_hash] = holders
    return LookupResult(
        node_to_epoch={node_id: int(epoch) for node_id, epoch in reply["nodes"].items()},
        mm_holders=mm_holders,
        node_to_num_prefix_blocks=reply["prefix"],
        membership_version=int(reply["version"]),
    )


def live_nodes_of(reply: dict) -> dict[str, NodeState]:
    """LIVE_NODES_SCRIPT's decoded reply."""
    return {node_id: _node_state(node_id, fields) for node_id, fields in reply.items()}


def membership_changes_of(reply: dict) -> MembershipChanges:
    """CHANGES_SCRIPT's decoded reply, when it is not nil."""
    nodes = {node_id: _node_state(node_id, fields) for node_id, fields in (reply["nodes"] or {}).items()}
    return MembershipChanges(int(reply["version"]), nodes, frozenset(reply["gone"] or ()))


def _node_state(node_id: str, fields: dict[str, str]) -> NodeState:
    config = ClusterConfig.from_settings({name[4:]: value for name, value in fields.items() if name.startswith("cfg:")})
    info = NodeInfo(node_id, fields.get("role", ""), fields.get("grpc", ""), fields.get("data", ""), fields.get("encodes") == "1", config)
    load, kv_usage = float(fields.get("load", 0)), float(fields.get("kv_usage", 0))
    return NodeState(info, int(fields["epoch"]), load, kv_usage, fields.get("seal", ""), adapters_of(fields.get("adapters", "")))
