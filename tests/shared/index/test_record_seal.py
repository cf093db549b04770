"""Sealed node records: what a reader admits, and that a sealed index drops everything a rejected
record would bring (tests of pure logic, on the in-process index and a fake clock)."""

from __future__ import annotations

import asyncio
import dataclasses

from services.router.membership import Membership
from shared.index.cluster_config import ClusterConfig
from shared.index.memory_backend import InProcessIndex
from shared.index.reader import LocalReader
from shared.index.record_seal import RecordSealer
from shared.index.sealed_index import SealedIndex
from shared.index.types import IndexEvents, MmEntry, NodeInfo, NodeState
from shared.types import BlockHash, MmHash
from tests.fake_clock import FakeClock

KEY = b"k" * 32
TTL_S = 5.0


def node(name: str = "prefill-0") -> NodeInfo:
    return NodeInfo(name, "prefill", f"{name}.example:50061", f"tcp://{name}.example:50071")


def sealed_state(sealer: RecordSealer, *, epoch: int = 3, load: float = 1.0, info: NodeInfo | None = None) -> NodeState:
    state = NodeState(info or node(), epoch, load, 0.5)
    return dataclasses.replace(state, seal=sealer.seal(state, ttl_s=TTL_S))


def test_a_record_sealed_with_the_cluster_key_is_admitted():
    sealer = RecordSealer(KEY, "tiny@abc", clock=FakeClock())
    assert sealer.rejection(sealed_state(sealer)) is None


def test_a_record_cannot_claim_adapters_its_writer_did_not_seal():
    sealer = RecordSealer(KEY, "tiny@abc", clock=FakeClock())
    state = NodeState(node(), 3, 1.0, 0.5, adapters=frozenset({"fa"}))
    state = dataclasses.replace(state, seal=sealer.seal(state, ttl_s=TTL_S))
    assert sealer.rejection(state) is None
    assert sealer.rejection(dataclasses.replace(state, adapters=frozenset({"fa", "fb"}))) == "bad_seal"


def test_unsealed_and_tampered_records_are_rejected():
    sealer = RecordSealer(KEY, "tiny@abc", clock=FakeClock())
    state = sealed_state(sealer)
    assert sealer.rejection(dataclasses.replace(state, seal="")) == "unsealed"
    assert sealer.rejection(dataclasses.replace(state, seal="garbage")) == "bad_seal"
    moved = dataclasses.replace(state, info=dataclasses.replace(state.info, grpc_address="attacker.example:1"))
    assert sealer.rejection(moved) == "bad_seal"
    assert sealer.rejection(dataclasses.replace(state, load=0.0)) == "bad_seal"  # load steers routing: sealed too
    regauged = dataclasses.replace(state, info=dataclasses.replace(state.info, config=ClusterConfig(block_size=32)))
    assert sealer.rejection(regauged) == "bad_seal"  # the settings decide whom readers serve: sealed too
    other_key = RecordSealer(b"x" * 32, "tiny@abc", clock=FakeClock())
    assert sealer.rejection(sealed_state(other_key)) == "bad_seal"


def test_a_record_sealed_for_other_weights_is_rejected():
    clock = FakeClock()
    v1, v2 = RecordSealer(KEY, "tiny@v1", clock=clock), RecordSealer(KEY, "tiny@v2", clock=clock)
    assert v2.rejection(sealed_state(v1)) == "bad_seal"


def test_a_copy_of_an_old_record_goes_stale_and_an_earlier_epoch_is_refused():
    clock = FakeClock()
    sealer = RecordSealer(KEY, "tiny@abc", max_skew_s=1.0, clock=clock)
    old = sealed_state(sealer, epoch=3)
    clock.now += TTL_S + 1.5
    assert sealer.rejection(old) == "stale"
    assert sealer.rejection(sealed_state(sealer, epoch=7)) is None
    assert sealer.rejection(sealed_state(sealer, epoch=3)) == "old_epoch"  # freshly sealed, but a past incarnation


def test_a_record_sealed_further_in_the_future_than_the_skew_allows_is_rejected():
    clock = FakeClock()
    reader = RecordSealer(KEY, "tiny@abc", max_skew_s=1.0, clock=clock)
    writer_ahead = RecordSealer(KEY, "tiny@abc", clock=lambda: clock.now + 10.0)
    assert reader.rejection(sealed_state(writer_ahead)) == "stale"


def test_a_forged_node_is_never_a_member_nor_credited_with_its_entries_and_is_counted():
    clock = FakeClock()
    inner = InProcessIndex(namespace="tiny@abc")
    index = SealedIndex(inner, RecordSealer(KEY, "tiny@abc", clock=clock))
    epoch = index.register_node(node("real"), ttl_s=TTL_S)
    assert index.heartbeat("real", epoch, load=2.0, kv_usage=0.1, ttl_s=TTL_S)
    forged = inner.register_node(node("forged"), ttl_s=TTL_S)  # written past the seal, as a stranger would
    entry = MmEntry(4, (1, 2, 2), 64)
    for node_id, e in (("real", epoch), ("forged", forged)):
        inner.publish(node_id, e, IndexEvents(mm_stored={MmHash("img"): entry}, kv_stored={BlockHash("b0"): "device"}))
    membership = Membership(LocalReader(index))
    asyncio.run(membership.refresh())
    assert set(membership.snapshot()) == {"real"} and membership.snapshot()["real"].load == 2.0
    result = index.lookup([MmHash("img")], [BlockHash("b0")])
    credited = membership.resolve(result.node_to_epoch)  # a lookup's names count only through the membership
    assert set(credited) == {"real"}
    assert index.sealer.metrics.unsealed.value == 1.0


def test_the_epochs_a_reader_remembers_are_bounded(monkeypatch):
    monkeypatch.setattr("shared.index.record_seal.MAX_REMEMBERED_NODES", 3)
    clock = FakeClock()
    sealer = RecordSealer(KEY, "tiny@abc", clock=clock)
    for i in range(5):
        assert sealer.rejection(sealed_state(sealer, epoch=10, info=node(f"n{i}"))) is None
    assert len(sealer._node_to_max_epoch) == 3
    assert sealer.rejection(sealed_state(sealer, epoch=9, info=node("n4"))) == "old_epoch"  # still remembered
    assert sealer.rejection(sealed_state(sealer, epoch=9, info=node("n0"))) is None  # forgotten: staleness alone guards it
