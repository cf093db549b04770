"""Routing policies as pure decisions over a snapshot: each policy's choice per role, that a
decision depends on the snapshot alone, and the llm-d baseline's memory of what it routed."""

from __future__ import annotations

import pytest

from services.router.llmd_lru import PodLru
from services.router.policies import (
    SERVED_POLICIES,
    CacheAwarePolicy,
    LlmdPolicy,
    RouteSnapshot,
    best_scored_choice,
    least_loaded_choice,
    make_policy,
    round_robin_choice,
)
from services.router.scoring import LOAD_WEIGHT, Candidate
from shared.types import BlockHash, MmHash, PlaceholderRange


def nodes(*specs):
    return [Candidate(name, load, kv) for name, load, kv in specs]


def snapshot(*, turn=0, images=(), hashes=(), encoders=("e1", "e2"), prefills=("p1", "p2"), decodes=("d1", "d2"), **holdings):
    as_candidates = lambda names: tuple(c if isinstance(c, Candidate) else Candidate(c, 0.0, 0.0) for c in names)  # noqa: E731
    return RouteSnapshot(
        turn, tuple(images), tuple(hashes), as_candidates(encoders), as_candidates(prefills), as_candidates(decodes), **holdings
    )


def image(name: str, length: int = 64) -> tuple[MmHash, PlaceholderRange]:
    return MmHash(name), PlaceholderRange(0, length)


def test_cache_aware_prefers_the_node_holding_more_work():
    candidates = nodes(("a", 0, 0.1), ("b", 0, 0.1))
    assert best_scored_choice(candidates, {"b": 512}) == "b"
    assert best_scored_choice(candidates, {}) == "a"  # tie: lowest id


def test_load_outweighs_a_small_cache_advantage_but_not_a_large_one():
    candidates = nodes(("hot", 3, 0.0), ("idle", 0, 0.0))
    assert best_scored_choice(candidates, {"hot": int(2 * LOAD_WEIGHT)}) == "idle"
    assert best_scored_choice(candidates, {"hot": int(4 * LOAD_WEIGHT)}) == "hot"


def test_a_node_serving_the_requests_adapter_wins_until_it_is_pin_slack_busier():
    lacking, serving = Candidate("lacking", 0, 0.0), Candidate("serving", 3, 0.0, has_adapter=True)
    assert best_scored_choice([lacking, serving], {}) == "serving"
    assert best_scored_choice([lacking, Candidate("serving", 5, 0.0, has_adapter=True)], {}) == "lacking"
    decodes = (Candidate("d1", 0, 0.0), Candidate("d2", 2, 0.0, has_adapter=True))
    assert CacheAwarePolicy().select(snapshot(decodes=decodes)).decode == "d2"
    busy = (Candidate("d1", 0, 0.0), Candidate("d2", 5, 0.0, has_adapter=True))
    assert CacheAwarePolicy().select(snapshot(decodes=busy)).decode == "d1"  # past the slack the adapter spreads


def test_full_kv_pool_is_penalised():
    assert best_scored_choice(nodes(("full", 0, 1.0), ("roomy", 0, 0.0)), {"full": 64}) == "roomy"


def test_round_robin_and_least_loaded():
    candidates = nodes(("a", 2, 0), ("b", 0, 0), ("c", 1, 0))
    assert [round_robin_choice(candidates, t) for t in range(4)] == ["a", "b", "c", "a"]
    assert least_loaded_choice(candidates, 0) == "b"


def test_ties_spread_by_rendezvous_hashing_and_are_stable():
    candidates = nodes(("a", 0, 0), ("b", 0, 0))
    picks = [best_scored_choice(candidates, {}, f"img{i}") for i in range(40)]
    assert set(picks) == {"a", "b"}
    assert picks == [best_scored_choice(candidates, {}, f"img{i}") for i in range(40)]


def test_least_loaded_cycles_through_equally_loaded_nodes():
    candidates = [Candidate("a", 0.0, 0.0), Candidate("b", 0.0, 0.0), Candidate("c", 2.0, 0.0)]
    assert [least_loaded_choice(candidates, t) for t in range(4)] == ["a", "b", "a", "b"]


def test_a_policy_is_named_once_and_an_unknown_name_is_refused():
    assert [make_policy(name).name for name in SERVED_POLICIES] == list(SERVED_POLICIES)
    with pytest.raises(ValueError, match="unknown routing policy 'random'; choose one of cache_aware, round_robin, least_loaded"):
        make_policy("random")
    with pytest.raises(ValueError, match="unknown routing policy 'llmd'"):
        make_policy("llmd")  # the simulator's baseline needs its LRU's capacity
    assert make_policy("llmd", llmd_lru_blocks=8).name == "llmd"


def test_cache_aware_pins_the_holders_and_ships_what_neither_holds_from_another_holder():
    held, other = image("held"), image("other")
    s = snapshot(images=[held, other], mm_holders={held[0]: {"e2"}, other[0]: {"p1"}})
    decision = CacheAwarePolicy().select(s)
    assert (decision.encoder, decision.prefill, dict(decision.image_to_source)) == ("e2", "p1", {})
    s = snapshot(images=[held, other], encoders=("e1", "e2", "e3"), mm_holders={held[0]: {"e2"}, other[0]: {"e3"}})
    assert dict(CacheAwarePolicy().select(s).image_to_source) == {other[0]: "e3"}


@pytest.mark.parametrize("name", SERVED_POLICIES)
def test_a_decision_depends_on_the_snapshot_alone(name):
    s = snapshot(turn=3, images=[image("x")], mm_holders={MmHash("x"): {"e2"}}, prefix_tokens={"p2": 64})
    policy = make_policy(name)
    first = policy.select(s)
    policy.observe(s, first)
    assert [make_policy(name).select(s) for _ in range(3)] == [first] * 3
    assert policy.select(s) == first


def test_llmd_learns_only_by_observing_its_own_decisions():
    hashes = [BlockHash(f"h{i}") for i in range(4)]
    policy = LlmdPolicy(lru_capacity=100)
    first_snapshot = snapshot(turn=1, images=[image("img")], hashes=hashes, prefills=("p1", "p2", "p3"))
    first = policy.select(first_snapshot)
    assert policy.select(first_snapshot) == first  # select alone remembers nothing
    policy.observe(first_snapshot, first)
    for turn in range(2, 6):  # whatever the turn, the pod it routed to holds the longest prefix
        again = policy.select(snapshot(turn=turn, images=[image("img")], hashes=[*hashes, BlockHash("h4")], prefills=("p1", "p2", "p3")))
        assert (again.encoder, again.prefill) == (first.encoder, first.prefill)


def test_llmd_ties_go_to_the_pod_with_fewest_calls_then_in_turn():
    busy = (Candidate("p1", 0.0, 0.0, queue=1), Candidate("p2", 0.0, 0.0, queue=1), Candidate("p3", 0.0, 0.0))
    assert LlmdPolicy(lru_capacity=8).select(snapshot(hashes=[BlockHash("new")], prefills=busy)).prefill == "p3"
    decodes = {LlmdPolicy(lru_capacity=8).select(snapshot(turn=t)).decode for t in range(4)}
    assert decodes == {"d1", "d2"}


def test_longest_prefix_follows_each_pods_own_lru():
    lru = PodLru(capacity=10)
    lru.add("a", ["b0", "b1", "b2"])
    lru.add("b", ["b0", "b1"])
    lru.add("c", ["x0"])
    assert lru.longest_prefix(["b0", "b1", "b2", "b3"], {"a", "b", "c"}) == (3, {"a"})
    assert lru.longest_prefix(["b0", "b1", "zz"], {"a", "b", "c"}) == (2, {"a", "b"})
    assert lru.longest_prefix(["b0", "b1"], {"b", "c"}) == (2, {"b"})  # only the candidates count
    assert lru.longest_prefix(["zz", "b0"], {"a", "b"}) == (0, set())  # a prefix ends at its first miss


def test_lru_evicts_the_least_recent_keys_per_pod():
    lru = PodLru(capacity=2)
    lru.add("a", ["k1", "k2"])
    lru.add("a", ["k1"])  # k1 becomes the most recent
    lru.add("a", ["k3"])
    assert lru.holders("k2") == set() and lru.holders("k1") == {"a"} and lru.holders("k3") == {"a"}
    assert lru.counts(["k1", "k3", "k9"], {"a"}) == {"a": 2}
    with pytest.raises(ValueError):
        PodLru(capacity=0)
