"""membership_changes, on every backend (conftest.py): the nodes each membership move was for,
with their records, so a reader that saw the version move reads only those."""

from __future__ import annotations

from shared.index.types import MEMBER_LOG_LENGTH, NodeInfo

TTL = 0.5


def node(name: str, role: str = "prefill") -> NodeInfo:
    return NodeInfo(name, role, f"{name}.example:50061", f"tcp://{name}.example:50071")


def version(index) -> int:
    return index.lookup([], []).membership_version


def test_changes_name_the_joined_with_their_records_and_the_gone(index):
    index.register_node(node("stays"), ttl_s=30)
    leaves = index.register_node(node("leaves", "encoder"), ttl_s=30)
    since = version(index)
    index.register_node(node("joins", "decode"), ttl_s=30, seal_fn=lambda e: f"seal-{e}")
    index.deregister_node("leaves", leaves)
    changes = index.membership_changes(since)
    assert changes is not None and changes.version == version(index) > since
    assert set(changes.nodes) == {"joins"} and changes.gone == {"leaves"}
    assert changes.nodes["joins"] == index.live_nodes()["joins"]  # the full record, seal and all


def test_no_change_since_the_current_version_is_an_empty_answer(index):
    index.register_node(node("a"), ttl_s=30)
    changes = index.membership_changes(version(index))
    assert changes is not None and changes.nodes == {} and changes.gone == frozenset()


def test_a_node_registered_again_is_named_once_with_its_new_epoch(index):
    index.register_node(node("r"), ttl_s=30)
    since = version(index)
    index.register_node(node("r"), ttl_s=30)
    newest = index.register_node(node("r"), ttl_s=30)
    changes = index.membership_changes(since)
    assert changes is not None and changes.nodes["r"].epoch == newest and changes.gone == frozenset()


def test_a_pruned_node_is_gone(index, lapse):
    index.register_node(node("dies"), ttl_s=TTL)
    since = version(index)
    lapse(TTL + 0.3)
    index.live_nodes()  # prunes it: a membership move
    changes = index.membership_changes(since)
    assert changes is not None and changes.gone == {"dies"}


def test_a_version_the_log_no_longer_reaches_or_never_had_asks_for_a_listing(index):
    index.register_node(node("first"), ttl_s=30)
    since = version(index)
    for i in range(MEMBER_LOG_LENGTH + 1):
        index.register_node(node(f"n{i}"), ttl_s=30)
    assert index.membership_changes(since) is None  # its first change was trimmed
    assert index.membership_changes(since + 1) is not None  # the log reaches back exactly that far
    assert index.membership_changes(version(index) + 10) is None  # a version it never had


def test_a_restarted_index_never_passes_for_the_old_one_s_continuation(index, restart):
    """A reader that knew version v of the old index asks the restarted one what changed since v:
    however many nodes registered again, the answer is "list them", never a partial log."""
    for name in ("a", "b", "c"):
        index.register_node(node(name), ttl_s=30)
    known = version(index)
    again = restart()
    for i in range(8):  # as many moves as before and more: a counter from 0 would pass `known`
        again.register_node(node(f"n{i % 3}"), ttl_s=30)
    assert version(again) > known
    assert again.membership_changes(known) is None


def test_a_heartbeat_carries_the_adapters_a_node_serves_and_a_change_of_them_is_a_membership_change(index):
    epoch = index.register_node(node("lora"), ttl_s=30)
    assert index.live_nodes()["lora"].adapters == frozenset()
    since = version(index)
    assert index.heartbeat("lora", epoch, load=1.0, kv_usage=0.0, ttl_s=30, adapters=frozenset({"fa", "fb"}))
    changes = index.membership_changes(since)
    assert changes is not None and changes.nodes["lora"].adapters == {"fa", "fb"}
    since = version(index)
    assert index.heartbeat("lora", epoch, load=2.0, kv_usage=0.0, ttl_s=30, adapters=frozenset({"fb", "fa"}))
    assert version(index) == since  # the same adapters: a plain heartbeat, no membership move
    assert index.heartbeat("lora", epoch, load=2.0, kv_usage=0.0, ttl_s=30)  # all unloaded
    changes = index.membership_changes(since)
    assert changes is not None and changes.nodes["lora"].adapters == frozenset()
    assert index.live_nodes()["lora"].adapters == frozenset()
