"""The arithmetic the routing policies share (pure): cached work per node, and adaptive dispatch."""

from __future__ import annotations

import pytest

from services.router.scoring import (
    PREFILL_TO_ENCODE_COST,
    Candidate,
    EncodeDispatch,
    encode_on_prefill,
    image_tokens_per_node,
    prefill_tokens_per_node,
    prefix_tokens_per_node,
    score,
)
from shared.types import PlaceholderRange


def test_prefix_tokens_are_leading_blocks_times_block_size():
    assert prefix_tokens_per_node({"a": 3, "b": 1}, 16) == {"a": 48, "b": 16}
    assert prefix_tokens_per_node({"a": 0}, 16) == {}
    assert prefix_tokens_per_node({}, 16) == {}


def test_image_tokens_sum_per_node():
    assert image_tokens_per_node({"x": {"e1": None}, "y": {"e1": None, "e2": None}}, {"x": 64, "y": 100}) == {"e1": 164, "e2": 100}


def encoder(queue: float) -> Candidate:
    """An encoder with that many of this gateway's calls on it (its heartbeat may say otherwise)."""
    return Candidate("e", 0.0, 0.0, queue=queue)


def prefill(busy: float, *, can_encode: bool = True, pending_tokens: float = 0.0) -> Candidate:
    """A prefill node whose engine is that busy, with many more calls on it (waiting on encoders)
    and ``pending_tokens`` of prompts routed to it still to prefill."""
    return Candidate("p", busy + 10, 0.0, can_encode, busy=busy, pending_tokens=pending_tokens)


def test_an_idle_encoder_always_encodes():
    assert not encode_on_prefill("adaptive", 256, encoder(0), prefill(0), mean_call_tokens=256)


def test_a_queued_encoder_sends_images_to_an_idle_prefill_node():
    assert encode_on_prefill("adaptive", 256, encoder(1), prefill(0), mean_call_tokens=256)


def test_the_prefill_nodes_own_load_weighs_against_encoding_there():
    # T * load(p) < load(e) * mean: 256 * 2 < 3 * 256 encodes there, 256 * 3 < 3 * 256 does not.
    assert encode_on_prefill("adaptive", 256, encoder(3), prefill(2), mean_call_tokens=256)
    assert not encode_on_prefill("adaptive", 256, encoder(3), prefill(3), mean_call_tokens=256)
    # A small image moves sooner than a large one at the same loads.
    assert encode_on_prefill("adaptive", 64, encoder(3), prefill(3), mean_call_tokens=256)
    assert not encode_on_prefill("adaptive", 1024, encoder(3), prefill(1), mean_call_tokens=256)


def test_the_prompt_tokens_a_prefill_node_owes_weigh_against_encoding_there():
    # R * pending(p) < queue(e) * mean: 0.4 * 600 = 240 < 256 encodes there; 0.4 * 700 = 280 does not.
    assert PREFILL_TO_ENCODE_COST == 0.4
    assert encode_on_prefill("adaptive", 256, encoder(1), prefill(0, pending_tokens=600), mean_call_tokens=256)
    assert not encode_on_prefill("adaptive", 256, encoder(1), prefill(0, pending_tokens=700), mean_call_tokens=256)
    # ... on top of its local encodes: 256 * 1 + 0.4 * 600 = 496 < 2 * 256 does, with 700 not.
    assert encode_on_prefill("adaptive", 256, encoder(2), prefill(1, pending_tokens=600), mean_call_tokens=256)
    assert not encode_on_prefill("adaptive", 256, encoder(2), prefill(1, pending_tokens=700), mean_call_tokens=256)


def test_a_prefill_node_without_a_vision_tower_never_encodes():
    assert not encode_on_prefill("adaptive", 256, encoder(50), prefill(0, can_encode=False), mean_call_tokens=256)
    assert not encode_on_prefill("prefill", 256, encoder(0), prefill(0, can_encode=False), mean_call_tokens=256)


def test_fixed_dispatches_and_nothing_to_encode():
    assert not encode_on_prefill("encoder", 256, encoder(50), prefill(0), mean_call_tokens=256)
    assert encode_on_prefill("prefill", 256, encoder(0), prefill(9), mean_call_tokens=256)
    assert not encode_on_prefill("prefill", 0, encoder(0), prefill(0), mean_call_tokens=256)
    with pytest.raises(ValueError, match="unknown encode dispatch 'anywhere'; choose one of adaptive, encoder, prefill"):
        EncodeDispatch("anywhere")


def test_a_prefill_node_is_credited_each_tower_run_it_saves_once():
    images = [("x", PlaceholderRange(10, 20)), ("y", PlaceholderRange(40, 8))]
    holders = {"x": {"p1": None, "p2": None}, "y": {"p2": None}}
    # p1's 32-token prefix covers x (ends at 30): x's tower run is saved, once, though p1 holds
    # its embeddings too. p2 holds both images' embeddings, beyond its (empty) prefix.
    assert prefill_tokens_per_node({"p1": 32}, holders, images) == {"p1": 32 + 20, "p2": 28}
    # p3 covers x without its embeddings (the embedding cache let it go): the same credit.
    assert prefill_tokens_per_node({"p3": 32}, {}, images) == {"p3": 52}
    assert prefill_tokens_per_node({"p4": 29}, {}, images) == {"p4": 29}  # x cut at 29: not covered
    assert prefill_tokens_per_node({}, {}, images) == {}


def test_an_encoder_already_encoding_big_images_is_charged_their_tokens():
    big = Candidate("e1", load=1, kv_usage=0.0, encode_tokens=1000)
    small = Candidate("e2", load=2, kv_usage=0.0, encode_tokens=20)
    assert score(big, 0) < score(small, 0)  # one request of big images weighs more than two small
    assert score(Candidate("e3", load=1, kv_usage=0.0), 0) - score(big, 0) == 1000
