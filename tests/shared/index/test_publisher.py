"""The publisher keeps the index in step with a node, and catches up after an index outage."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from shared.index.backend import create_index
from shared.index.cluster_config import ClusterConfig, ConfigMismatchError, Disagreement
from shared.index.memory_backend import InProcessIndex
from shared.index.publisher import IndexPublisher
from shared.index.types import IndexEvents, IndexUnavailableError, MmEntry, NodeInfo
from shared.types import BlockHash, MmHash
from tests.redis_servers import running_server, valkey_binary

ENTRY = MmEntry(16, (1, 8, 8), 4096)


def _wait_for(predicate, timeout_s=10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except IndexUnavailableError:  # still recovering (a circuit breaker may hold calls back)
            pass
        time.sleep(0.05)
    return False


def test_events_are_published_in_batches_and_evictions_cancel_stores():
    index = create_index("memory://", namespace="pub")
    publisher = IndexPublisher(index, NodeInfo("enc", "encoder", "a:1"), ttl_s=2)
    publisher.start()
    try:
        publisher.record(IndexEvents(mm_stored={MmHash("x"): ENTRY, MmHash("y"): ENTRY}))
        publisher.record(IndexEvents(mm_evicted=[MmHash("y")], kv_stored={BlockHash("b"): "device"}))
        assert publisher.flush()
        result = index.lookup([MmHash("x"), MmHash("y")], [BlockHash("b")])
        assert result.mm_holders[MmHash("x")] == {"enc": ENTRY} and result.mm_holders[MmHash("y")] == {}
        assert result.node_to_num_prefix_blocks == {"enc": 1}
        assert publisher.metrics.publish_time.value.count >= 1 and publisher.metrics.num_publish_failures.value == 0
        time.sleep(2.5)  # heartbeats keep the node alive past its TTL
        assert "enc" in index.live_nodes()
    finally:
        publisher.stop()


def test_index_outage_then_restart_catches_up_from_the_node_snapshot():
    from services.stack.node_process import free_port

    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    binary = valkey_binary()
    with running_server(binary, port=port):
        index = create_index(url, namespace="outage")
        publisher = IndexPublisher(index, NodeInfo("pf", "prefill", "a:1"), ttl_s=1.0)
        publisher.start()
        publisher.record(IndexEvents(kv_stored={BlockHash("b0"): "device"}))
        assert publisher.flush()
    # The server is gone: recording must neither block nor raise (it only queues; a blocked
    # record would hang this thread on the index's timeouts).
    recorder = threading.Thread(
        target=publisher.record, args=(IndexEvents(kv_stored={BlockHash("b1"): "device"}, kv_evicted=[BlockHash("b0")]),)
    )
    recorder.start()
    recorder.join(timeout=5)
    assert not recorder.is_alive()
    time.sleep(1.5)
    assert publisher.metrics.num_publish_failures.value > 0
    try:
        with running_server(binary, port=port):  # a fresh, empty index on the same address
            assert _wait_for(lambda: index.lookup([], [BlockHash("b1")]).node_to_num_prefix_blocks == {"pf": 1})
            assert index.lookup([], [BlockHash("b0")]).node_to_num_prefix_blocks == {}
    finally:
        publisher.stop()


def test_nothing_is_registered_before_start_and_deregister_withdraws_everything():
    index = create_index("memory://", namespace="drain")
    publisher = IndexPublisher(index, NodeInfo("dec", "decode", "a:1"), ttl_s=2)
    publisher.record(IndexEvents(kv_stored={BlockHash("b"): "device"}))
    time.sleep(0.2)
    assert index.live_nodes() == {}  # not serving yet: not a member
    publisher.start()
    assert publisher.flush()
    assert index.lookup([], [BlockHash("b")]).node_to_num_prefix_blocks == {"dec": 1}
    publisher.deregister()
    assert index.live_nodes() == {}
    assert index.lookup([], [BlockHash("b")]).node_to_num_prefix_blocks == {}


def test_a_node_whose_compute_loop_hangs_stops_heartbeating_and_lapses():
    index = create_index("memory://", namespace="hung")
    alive = [True]
    publisher = IndexPublisher(index, NodeInfo("enc", "encoder", "a:1"), ttl_s=0.6, alive_fn=lambda: alive[0])
    publisher.start()
    try:
        assert publisher.flush()
        time.sleep(1.0)
        assert "enc" in index.live_nodes()  # heartbeats kept it past its TTL
        alive[0] = False
        assert _wait_for(lambda: "enc" not in index.live_nodes(), timeout_s=3)
        assert publisher.metrics.num_heartbeats_withheld.value > 0
    finally:
        publisher.stop()


def test_a_node_the_cluster_refuses_learns_it_when_it_starts():
    index = create_index("memory://", namespace="refused")
    index.register_node(NodeInfo("first", "prefill", "a:1", config=ClusterConfig(block_size=16)), ttl_s=30)
    publisher = IndexPublisher(index, NodeInfo("odd", "prefill", "b:1", config=ClusterConfig(block_size=32)), ttl_s=2)
    with pytest.raises(ConfigMismatchError, match="block_size is 32, the cluster's is 16"):
        publisher.start()
    assert publisher.refusal is not None and publisher.epoch is None
    assert set(index.live_nodes()) == {"first"}


class _RefusesLaterRegistrations(InProcessIndex):
    """A cluster redeployed with other settings while this node was away: it registers once only."""

    def __init__(self) -> None:
        super().__init__(namespace="redeployed")
        self.num_registrations = 0

    def register_node(self, node, *, ttl_s, seal_fn=None):
        self.num_registrations += 1
        if self.num_registrations > 1:
            raise ConfigMismatchError(self.namespace, node.node_id, [Disagreement("block_size", "16", "32")])
        return super().register_node(node, ttl_s=ttl_s, seal_fn=seal_fn)


def test_a_later_refusal_ends_the_publisher_and_tells_the_node():
    index = _RefusesLaterRegistrations()
    refusals: list[ConfigMismatchError] = []
    publisher = IndexPublisher(index, NodeInfo("pf", "prefill", "a:1"), ttl_s=0.3, on_refused=refusals.append)
    publisher.start()
    try:
        index.deregister_node("pf", publisher.epoch)  # its next heartbeat fails: it registers again
        assert _wait_for(lambda: refusals, timeout_s=3)
        assert publisher.refusal is refusals[0]
        publisher._thread.join(timeout=3)
        assert not publisher._thread.is_alive()
    finally:
        publisher.stop()


class _GatedIndex(InProcessIndex):
    """Holds each publish until the test opens the gate, so changes pile up behind it."""

    def __init__(self) -> None:
        super().__init__(namespace="gated")
        self.gate = threading.Event()
        self.gate.set()
        self.num_publishing = 0

    def publish(self, node_id, epoch, events):
        self.num_publishing += 1
        self.gate.wait(timeout=10)
        super().publish(node_id, epoch, events)


def test_a_hash_evicted_then_stored_again_while_a_publish_is_in_flight_stays_held():
    index = _GatedIndex()
    publisher = IndexPublisher(index, NodeInfo("enc", "encoder", "a:1"), ttl_s=2)
    publisher.start()
    try:
        publisher.record(IndexEvents(mm_stored={MmHash("x"): ENTRY}))
        assert publisher.flush()
        index.gate.clear()
        num_before = index.num_publishing
        publisher.record(IndexEvents(mm_stored={MmHash("y"): ENTRY}))
        assert _wait_for(lambda: index.num_publishing > num_before)  # y's batch waits at the gate
        assert not publisher.flush(timeout_s=0.2)  # taken from the queue is not yet published
        publisher.record(IndexEvents(mm_evicted=[MmHash("x")]))
        publisher.record(IndexEvents(mm_stored={MmHash("x"): ENTRY}))  # the next batch nets to "x held"
        index.gate.set()
        assert publisher.flush()
        result = index.lookup([MmHash("x"), MmHash("y")], [])
        assert result.mm_holders == {MmHash("x"): {"enc": ENTRY}, MmHash("y"): {"enc": ENTRY}}
    finally:
        index.gate.set()
        publisher.stop()


def test_an_index_stalled_past_its_timeout_costs_a_failure_but_not_the_epoch():
    """A reply later than the client's 1 s timeout (a loaded machine) but within the TTL: the call
    is counted as failed, yet the node keeps its epoch (no re-registration, so routers never see
    its entries go stale) and what it recorded meanwhile is published once the index answers."""
    from services.stack.node_process import free_port
    from services.stack.redis_server import start_redis_server

    process, url = start_redis_server(valkey_binary(), free_port())
    try:
        index = create_index(url, namespace="stall")
        publisher = IndexPublisher(index, NodeInfo("pf", "prefill", "a:1"), ttl_s=6.0)
        publisher.start()
        publisher.record(IndexEvents(kv_stored={BlockHash("b0"): "device"}))
        assert publisher.flush()
        epoch = publisher.epoch
        process.send_signal(signal.SIGSTOP)
        publisher.record(IndexEvents(kv_stored={BlockHash("b1"): "device"}))
        time.sleep(1.6)
        process.send_signal(signal.SIGCONT)
        assert publisher.metrics.num_publish_failures.value > 0
        b0_b1 = [BlockHash("b0"), BlockHash("b1")]
        assert _wait_for(lambda: index.lookup([], b0_b1).node_to_num_prefix_blocks == {"pf": 2})
        assert publisher.epoch == epoch
        publisher.stop()
    finally:
        process.send_signal(signal.SIGCONT)
        process.terminate()
        process.wait(timeout=5)


def test_a_change_of_the_adapters_a_node_serves_reaches_its_record_at_once_not_a_heartbeat_later():
    index = InProcessIndex(namespace="pub")
    served = {"fa"}
    publisher = IndexPublisher(index, NodeInfo("pf", "prefill", "a:1"), ttl_s=60, adapters_fn=lambda: frozenset(served))
    publisher.start()
    try:
        assert _wait_for(lambda: index.live_nodes()["pf"].adapters == {"fa"}, timeout_s=2)  # the first heartbeat brings them
        served.add("fb")
        time.sleep(0.5)
        assert index.live_nodes()["pf"].adapters == {"fa"}  # the next heartbeat is ttl/3 = 20 s away
        publisher.record_changed()
        assert _wait_for(lambda: index.live_nodes()["pf"].adapters == {"fa", "fb"}, timeout_s=2)
    finally:
        publisher.stop()
