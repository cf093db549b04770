"""The llm-d-style baseline's scorer: per-pod LRU prefix matching, least-loaded tie-breaks, no
index."""

from __future__ import annotations

import pytest

from services.bench.simulate.llmd_scorer import LlmdScorer, PodLru
from services.router.membership import Membership
from services.router.router import NoLiveNodeError
from shared.types import BlockHash, MmHash, PlaceholderRange

NODES = {"encoder": ("e1", "e2"), "prefill": ("p1", "p2", "p3"), "decode": ("d1", "d2")}


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


def _scorer(capacity: int = 100) -> LlmdScorer:
    return LlmdScorer(Membership(None, static=NODES), lru_capacity=capacity)


def _image(name: str) -> tuple[MmHash, PlaceholderRange]:
    return MmHash(name), PlaceholderRange(0, 4)


def test_a_repeated_prompt_goes_back_to_the_pod_it_went_to():
    scorer = _scorer()
    hashes = [BlockHash(f"h{i}") for i in range(4)]
    first = scorer.route([1] * 64, [_image("img")], block_hashes=hashes)
    again = scorer.route([1] * 80, [_image("img")], block_hashes=[*hashes, BlockHash("h4")])
    assert (again.encoder, again.prefill) == (first.encoder, first.prefill)
    assert again.prefix_tokens_by_node == {} and again.local_encode == frozenset()  # nothing from the index


def test_ties_go_to_the_least_loaded_pod_then_in_turn():
    scorer = _scorer()
    busy = scorer.membership.in_flight("prefill@p1", "p1", "p2")
    routes = [scorer.route([1] * 16, [], block_hashes=[BlockHash(f"new{i}")]) for i in range(2)]
    assert routes[0].prefill == "p3"  # p1 and p2 carry this gateway's work
    busy.release()
    assert routes[1].prefill in ("p1", "p2", "p3")
    decodes = {scorer.route([1] * 16, [], block_hashes=[BlockHash(f"more{i}")]).decode for i in range(4)}
    assert decodes == {"d1", "d2"}  # equal loads: in turn


def test_reservation_counts_the_route_on_its_nodes_until_released():
    scorer = _scorer()
    route = scorer.route([1] * 16, [_image("img")], block_hashes=[BlockHash("h0")], reserve=True)
    assert scorer.membership.num_in_flight(route.prefill) == 1 and scorer.membership.num_in_flight(route.encoder) == 1
    route.reservation.release()
    route.reservation.release()  # once, however often
    assert scorer.membership.num_in_flight(route.prefill) == 0


def test_excluded_pods_are_never_chosen_and_an_empty_role_raises():
    scorer = _scorer()
    hashes = [BlockHash("h0")]
    first = scorer.route([1] * 16, [], block_hashes=hashes)
    again = scorer.route([1] * 16, [], block_hashes=hashes, exclude=frozenset({first.prefill}))
    assert again.prefill != first.prefill
    with pytest.raises(NoLiveNodeError):
        scorer.route([1] * 16, [], block_hashes=hashes, exclude=frozenset(NODES["decode"]))
