"""Membership: live nodes from the index, the last-known set through an outage, quarantine."""

from __future__ import annotations

import asyncio
import random

from services.router.membership import Membership
from shared.index.memory_backend import InProcessIndex
from shared.index.reader import LocalReader
from shared.index.types import IndexUnavailableError, NodeInfo
from tests.fake_clock import FakeClock


def register(index: InProcessIndex, role: str, address: str, ttl_s: float = 60) -> int:
    return index.register_node(NodeInfo(f"{role}@{address}", role, address, f"tcp://{address}"), ttl_s=ttl_s)


def addresses(membership: Membership, role: str) -> list[str]:
    return [s.info.grpc_address for s in membership.nodes(role)]


def test_nodes_come_from_the_index_and_the_last_known_set_survives_an_outage():
    index = InProcessIndex()
    register(index, "encoder", "e:1")
    register(index, "decode", "d:1")
    membership = Membership(LocalReader(index))
    assert asyncio.run(membership.refresh()) and addresses(membership, "encoder") == ["e:1"]
    register(index, "encoder", "e:2")
    asyncio.run(membership.refresh())
    assert addresses(membership, "encoder") == ["e:1", "e:2"]
    index.live_nodes = lambda: (_ for _ in ()).throw(IndexUnavailableError("down"))
    assert not asyncio.run(membership.refresh())
    assert addresses(membership, "encoder") == ["e:1", "e:2"] and membership.num_refresh_failures == 1


def test_a_failed_node_is_quarantined_until_its_time_is_up_or_it_restarts():
    clock = FakeClock(0.0)
    index = InProcessIndex(clock=clock)
    register(index, "decode", "d:1")
    register(index, "decode", "d:2")
    membership = Membership(LocalReader(index), quarantine_s=5, clock=clock)
    asyncio.run(membership.refresh())
    membership.report_failure("d:1")
    assert addresses(membership, "decode") == ["d:2"]
    clock.now += 5.1
    assert addresses(membership, "decode") == ["d:1", "d:2"]
    membership.report_failure("d:2")
    assert addresses(membership, "decode") == ["d:1"]
    register(index, "decode", "d:2")  # restarted in place: a new epoch
    asyncio.run(membership.refresh())
    assert addresses(membership, "decode") == ["d:1", "d:2"]


def test_quarantined_nodes_are_used_when_nothing_else_is_left():
    index = InProcessIndex()
    register(index, "prefill", "p:1")
    membership = Membership(LocalReader(index))
    asyncio.run(membership.refresh())
    membership.report_failure("p:1")
    assert addresses(membership, "prefill") == ["p:1"]
    assert membership.nodes("prefill", exclude=frozenset({"p:1"})) == []


def test_static_lists_stand_in_without_an_index():
    membership = Membership(None, {"preprocess": ("a:1",), "encoder": ("e:1", "e:2")})
    assert addresses(membership, "encoder") == ["e:1", "e:2"] and addresses(membership, "preprocess") == ["a:1"]


def test_a_role_an_empty_index_no_longer_lists_is_kept_for_a_while():
    """A restarted, empty index lists nobody until the nodes register again: routing goes on."""
    clock = FakeClock(0.0)
    index = InProcessIndex(clock=clock)
    register(index, "encoder", "e:1")
    register(index, "decode", "d:1")
    membership = Membership(LocalReader(index), keep_s=15, clock=clock)
    asyncio.run(membership.refresh())
    membership.update({})  # the index came back empty
    assert addresses(membership, "encoder") == ["e:1"] and addresses(membership, "decode") == ["d:1"]
    clock.now += 16
    membership.update({})
    assert membership.nodes("encoder") == []


class CountingIndex(InProcessIndex):
    def __init__(self) -> None:
        super().__init__()
        self.num_listings = 0

    def live_nodes(self):
        self.num_listings += 1
        return super().live_nodes()


def test_a_new_version_applies_only_the_changed_nodes_and_lists_when_the_log_cannot_say():
    index = CountingIndex()
    for i in range(5):
        register(index, "decode", f"d:{i}")
    membership = Membership(LocalReader(index))
    asyncio.run(membership.refresh())
    asyncio.run(membership.note_version(index.lookup([], []).membership_version))
    listings = index.num_listings
    register(index, "encoder", "e:1")
    index.deregister_node("decode@d:0", index.live_nodes()["decode@d:0"].epoch)
    listings += 1  # the line above listed them itself
    asyncio.run(membership.note_version(index.lookup([], []).membership_version))
    assert addresses(membership, "encoder") == ["e:1"] and addresses(membership, "decode") == ["d:1", "d:2", "d:3", "d:4"]
    assert index.num_listings == listings, "a join and a drain listed the whole cluster"
    index.membership_changes = lambda since: None  # the log no longer reaches back: list them
    register(index, "encoder", "e:2")
    asyncio.run(membership.note_version(index.lookup([], []).membership_version))
    assert addresses(membership, "encoder") == ["e:1", "e:2"] and index.num_listings == listings + 1


def test_a_large_roles_sample_is_its_usable_holders_and_a_random_draw_of_k_others():
    clock = FakeClock(0.0)
    membership = Membership(None, {"prefill": tuple(f"p:{i:02d}" for i in range(40))}, quarantine_s=5, clock=clock)
    membership.report_failure("p:05")
    excluded = frozenset({"p:07", "p:09"})
    draws = []
    for turn in range(30):
        sample = membership.sample("prefill", exclude=excluded, holders={"p:30": 1, "p:07": 1, "x:1": 1}, k=8, rng=random.Random(turn))
        picked = [s.info.grpc_address for s in sample]
        assert picked[0] == "p:30" and len(picked) == 9 == len(set(picked))  # the usable holder, then 8 others
        assert not {"p:05", "p:07", "p:09"} & set(picked)  # quarantined or excluded: never drawn
        draws.append(frozenset(picked))
    assert len(set(draws)) > 1  # the draw changes with the generator
    assert membership.sample("prefill", exclude=frozenset(), holders={}, k=40, rng=random.Random(0)) is None  # small enough: all of them
    everyone = frozenset(f"p:{i:02d}" for i in range(40))
    assert membership.sample("prefill", exclude=everyone, holders={}, k=8, rng=random.Random(0)) is None  # nothing usable


def test_served_quarantines_are_forgotten_at_the_next_failure():
    clock = FakeClock(0.0)
    membership = Membership(None, {"decode": ("d:1", "d:2")}, quarantine_s=5, clock=clock)
    membership.report_failure("d:1")
    clock.now += 6
    membership.report_failure("d:2")
    assert set(membership._address_to_quarantine) == {"d:2"}


def test_a_lookups_names_resolve_to_member_records_of_the_same_epoch_only():
    index = InProcessIndex()
    old = register(index, "prefill", "p:1")
    register(index, "prefill", "p:2")
    membership = Membership(LocalReader(index))
    asyncio.run(membership.refresh())
    resolved = membership.resolve({"prefill@p:1": old, "prefill@p:9": 1})  # p:9: no member record
    assert list(resolved) == ["prefill@p:1"] and resolved["prefill@p:1"].info.grpc_address == "p:1"
    new = register(index, "prefill", "p:1")  # restarted: until the membership sees it, its new entries count for nothing
    assert membership.resolve({"prefill@p:1": new}) == {}
    asyncio.run(membership.refresh())
    assert list(membership.resolve({"prefill@p:1": new})) == ["prefill@p:1"] and membership.resolve({"prefill@p:1": old}) == {}
