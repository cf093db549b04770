"""The router with the llm-d-style baseline policy (policies.LlmdPolicy), as the simulator runs it:
per-pod LRU prefix matching, fewest-calls tie-breaks, no index."""

from __future__ import annotations

import asyncio

import pytest

from services.router.membership import Membership
from services.router.policies import make_policy
from services.router.route import NoLiveNodeError
from services.router.router import Router
from shared.types import BlockHash, MmHash, PlaceholderRange

NODES = {"encoder": ("e1", "e2"), "prefill": ("p1", "p2", "p3"), "decode": ("d1", "d2")}


def _scorer(capacity: int = 100) -> Router:
    """The router with the llm-d baseline, as the simulator runs it (images on the encoder tier)."""
    return Router(Membership(None, static=NODES), make_policy("llmd", llmd_lru_blocks=capacity), encode_dispatch="encoder")


def _image(name: str) -> tuple[MmHash, PlaceholderRange]:
    return MmHash(name), PlaceholderRange(0, 4)


def test_a_repeated_prompt_goes_back_to_the_pod_it_went_to():
    scorer = _scorer()
    hashes = [BlockHash(f"h{i}") for i in range(4)]
    first = asyncio.run(scorer.route([1] * 64, [_image("img")], block_hashes=hashes))
    again = asyncio.run(scorer.route([1] * 80, [_image("img")], block_hashes=[*hashes, BlockHash("h4")]))
    assert (again.encoder, again.prefill) == (first.encoder, first.prefill)
    assert again.prefix_tokens_by_node == {} and again.local_encode == frozenset()  # nothing from the index


def test_ties_go_to_the_least_loaded_pod_then_in_turn():
    scorer = _scorer()
    busy = scorer.membership.in_flight("prefill@p1", "p1", "p2")
    routes = [asyncio.run(scorer.route([1] * 16, [], block_hashes=[BlockHash(f"new{i}")])) for i in range(2)]
    assert routes[0].prefill == "p3"  # p1 and p2 carry this gateway's work
    busy.release()
    assert routes[1].prefill in ("p1", "p2", "p3")
    decodes = {asyncio.run(scorer.route([1] * 16, [], block_hashes=[BlockHash(f"more{i}")])).decode for i in range(4)}
    assert decodes == {"d1", "d2"}  # equal loads: in turn


def test_reservation_counts_the_route_on_its_nodes_until_released():
    scorer = _scorer()
    route = asyncio.run(scorer.route([1] * 16, [_image("img")], block_hashes=[BlockHash("h0")], reserve=True))
    assert scorer.membership.num_in_flight(route.prefill) == 1 and scorer.membership.num_in_flight(route.encoder) == 1
    route.reservation.release()
    route.reservation.release()  # once, however often
    assert scorer.membership.num_in_flight(route.prefill) == 0


def test_excluded_pods_are_never_chosen_and_an_empty_role_raises():
    scorer = _scorer()
    hashes = [BlockHash("h0")]
    first = asyncio.run(scorer.route([1] * 16, [], block_hashes=hashes))
    again = asyncio.run(scorer.route([1] * 16, [], block_hashes=hashes, exclude=frozenset({first.prefill})))
    assert again.prefill != first.prefill
    with pytest.raises(NoLiveNodeError):
        asyncio.run(scorer.route([1] * 16, [], block_hashes=hashes, exclude=frozenset(NODES["decode"])))
