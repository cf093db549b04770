"""The index's trust on a real stack: Valkey refuses clients without the password, and node
records written by someone who can reach the index but lacks the cluster's key (no seal, a seal
under another key, a real node's seal copied onto another address, a dead node's genuine record
put back) get no request and no connection."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import threading
import time

import pytest
import redis

from shared.index.cluster_config import ClusterConfig
from shared.index.record_seal import RecordSealer
from shared.index.types import NodeInfo, NodeState
from tests.factories import chat_case
from tests.services.stack.conftest import launch_stack, stop_stack
from tests.services.stack.e2e_helpers import GREEDY, client_for, oracle_text, png
from tests.services.stack.stack_probes import wait_until

ROLES = ("preprocess", "encoder", "prefill", "decode")


class CountingListener:
    """A plain TCP listener on loopback that counts the connections it is offered."""

    def __init__(self, port: int = 0) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.num_accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self.sock.accept()
            except OSError:
                continue
            self.num_accepted += 1
            connection.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


def test_the_index_refuses_clients_without_the_password(stack):
    stranger = redis.Redis.from_url(stack.state()["valkey"]["url"], socket_timeout=5)
    with pytest.raises(redis.RedisError, match="(?i)auth"):
        stranger.set("tessera:stranger", "1")
    stranger.close()
    with stack.redis_client() as member:
        assert member.get("tessera:stranger") is None


def _forge(raw: redis.Redis, prefix: str, node_id: str, role: str, address: str, seal: str | None) -> None:
    epoch = int(raw.incr(prefix + "epochs"))
    fields = {"role": role, "grpc": address, "data": f"tcp://{address}", "encodes": int(role == "prefill"), "epoch": epoch}
    fields |= {"load": 0, "kv_usage": 0} | ({"seal": seal} if seal is not None else {})
    raw.set(prefix + f"epoch:{node_id}", epoch)
    raw.hset(prefix + f"node:{node_id}", mapping=fields)
    raw.pexpire(prefix + f"node:{node_id}", 120_000)
    raw.sadd(prefix + "nodes", node_id)


def test_forged_node_records_get_no_request_and_no_connection(stack, tiny_model, oracle):
    prefix = f"tessera:{tiny_model.model_id}:"
    listener = CountingListener()
    raw = stack.redis_client()
    forged: list[str] = []
    before = stack.metrics()  # rejections are counted as the membership refresh reads the records, not per request
    try:
        real = {n: raw.hgetall(prefix + f"node:{n}") for n in raw.smembers(prefix + "nodes")}
        wrong_key = RecordSealer(b"not-the-cluster-key-" * 2, tiny_model.model_id)
        for role in ROLES:
            (real_seal,) = [fields["seal"] for fields in real.values() if fields.get("role") == role][:1]
            assert real_seal, f"the real {role} node's record is sealed"
            forged_info = NodeInfo(f"forged-{role}", role, listener.address, f"tcp://{listener.address}")
            other_key_seal = wrong_key.seal(NodeState(forged_info, 1, 0.0, 0.0), ttl_s=60)
            for kind, seal in (("unsealed", None), ("other-key", other_key_seal), ("copied", real_seal)):
                node_id = f"forged-{kind}-{role}"
                _forge(raw, prefix, node_id, role, listener.address, seal)
                forged.append(node_id)
        time.sleep(2.0)  # the gateway's membership refreshes at least once a second

        client = client_for(stack)
        for i in range(6):
            case = chat_case(png(112, 112, 900 + i % 3), f"Question {i}?")
            reply = client.chat.completions.create(model="tiny", messages=case.body["messages"], **GREEDY)
            assert reply.choices[0].message.content == oracle_text(oracle, case)[0], i
        after = stack.metrics()

        assert listener.num_accepted == 0, "a forged node was dialled"
        for reason in ("unsealed", "bad_seal"):
            name = f"tessera_index_records_rejected_{reason}_total"
            assert after[name] > before.get(name, 0.0), name
    finally:
        for node_id in forged:
            raw.delete(prefix + f"node:{node_id}", prefix + f"epoch:{node_id}")
            raw.srem(prefix + "nodes", node_id)
        raw.close()
        listener.close()
    assert wait_until(lambda: client_for(stack).models.list().data, 5)


def test_a_real_node_record_names_its_fingerprinted_namespace_in_its_seal(stack, tiny_model):
    """Readers of another set of weights reject the stack's own records: the namespace, name@fingerprint,
    is inside every seal."""
    prefix = f"tessera:{tiny_model.model_id}:"
    key = stack.internal_auth().record_key
    assert key is not None
    with stack.redis_client() as raw:
        node_id = next(iter(raw.smembers(prefix + "nodes")))
        fields = raw.hgetall(prefix + f"node:{node_id}")
    config = ClusterConfig.from_settings({name.removeprefix("cfg:"): value for name, value in fields.items() if name.startswith("cfg:")})
    info = NodeInfo(node_id, fields["role"], fields["grpc"], fields["data"], fields["encodes"] == "1", config)
    state = NodeState(info, int(fields["epoch"]), float(fields["load"]), float(fields["kv_usage"]), fields["seal"])
    assert RecordSealer(key, tiny_model.model_id).rejection(state) is None
    assert RecordSealer(key, tiny_model.model_id + "-other").rejection(state) == "bad_seal"
    assert RecordSealer(key, tiny_model.model_id).rejection(dataclasses.replace(state, epoch=state.epoch + 1)) == "bad_seal"


def test_a_replayed_record_of_a_dead_node_goes_stale_and_its_address_gets_no_connection(tmp_path, repo_root, tiny_model, oracle):
    """The replay that matters in a cluster: a node died, its address was handed to someone else,
    who puts the node's last genuine record back. The seal verifies, but it is older than the TTL
    plus the allowed clock skew (1 s here), so nobody dials it."""
    stack = launch_stack(tmp_path, repo_root, "--encoders", "2", "--no-restart", "--index-record-max-skew-s", "1")
    listeners: list[CountingListener] = []
    try:
        prefix = f"tessera:{tiny_model.model_id}:"
        victim = stack.state()["roles"]["encoder-1"]
        node_id = f"encoder@{victim['grpc_address']}"
        with stack.redis_client() as raw:
            record = raw.hgetall(prefix + f"node:{node_id}")
            assert record.get("seal"), record
            os.kill(victim["pid"], signal.SIGKILL)
            assert wait_until(lambda: not raw.exists(prefix + f"node:{node_id}"), 20), "the dead node's record did not lapse"
            # The dead node's ports, now someone else's.
            for address in (record["grpc"], record["data"].removeprefix("tcp://")):
                listeners.append(CountingListener(int(address.rsplit(":", 1)[1])))
            time.sleep(2.0)  # past TTL + skew since its last seal, whatever the timing above
            raw.set(prefix + f"epoch:{node_id}", record["epoch"])
            raw.hset(prefix + f"node:{node_id}", mapping=record)
            raw.pexpire(prefix + f"node:{node_id}", 120_000)
            raw.sadd(prefix + "nodes", node_id)
        time.sleep(2.0)  # a membership refresh reads it
        before = stack.metrics()
        client = client_for(stack)
        for i in range(4):
            case = chat_case(png(112, 112, 950 + i), f"Replay {i}?")
            reply = client.chat.completions.create(model="tiny", messages=case.body["messages"], **GREEDY)
            assert reply.choices[0].message.content == oracle_text(oracle, case)[0], i
        after = stack.metrics()
        assert sum(listener.num_accepted for listener in listeners) == 0, "the replayed record was dialled"
        name = "tessera_index_records_rejected_stale_total"
        assert after[name] > before.get(name, 0.0)
    finally:
        for listener in listeners:
            listener.close()
        stop_stack(stack)
