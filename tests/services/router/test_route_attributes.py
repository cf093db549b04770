"""A route as span attributes: the chosen nodes, what they held, and the one-line reason."""

from __future__ import annotations

from services.router.route import Route
from services.router.route_attributes import route_attributes, route_reason
from shared.types import MmHash


def make_route(**overrides) -> Route:
    fields = {
        "encoder": "e:1",
        "prefill": "p:1",
        "decode": "d:1",
        "images_on_encoder": frozenset({MmHash("a")}),
        "prefix_tokens_by_node": {"p:1": 32, "d:1": 48},
        "decision_s": 0.0012,
    }
    return Route(**{**fields, **overrides})


def test_attributes_name_the_nodes_what_they_held_and_a_better_kv_source():
    attributes = route_attributes(make_route(), policy="cache_aware", num_images=2, num_prompt_tokens=60)
    assert attributes["tessera.route.encoder"] == "e:1" and attributes["tessera.route.decode"] == "d:1"
    assert attributes["tessera.route.images"] == 2 and attributes["tessera.route.images_on_encoder"] == 1
    assert attributes["tessera.route.prefill_prefix_tokens"] == 32 and attributes["tessera.route.decision_ms"] == 1.2
    assert attributes["tessera.route.kv_source"] == "d:1" and attributes["tessera.route.kv_source_prefix_tokens"] == 48
    assert attributes["tessera.route.reason"] == "cache_aware: encoder holds 1/2 images; prefill holds 32/60 prompt tokens"


def test_no_kv_source_when_the_prefill_node_holds_the_longest_prefix():
    attributes = route_attributes(make_route(prefix_tokens_by_node={"p:1": 48}), policy="cache_aware", num_images=0, num_prompt_tokens=60)
    assert "tessera.route.kv_source" not in attributes


def test_reason_without_cached_work():
    route = make_route(images_on_encoder=frozenset(), prefix_tokens_by_node={})
    assert route_reason(route, policy="round_robin", num_images=0, num_prompt_tokens=9) == "round_robin: no cached work to place by"


def test_images_shipped_by_other_holders_are_counted_and_said():
    route = make_route(image_to_source={MmHash("b"): "p:2"})
    attributes = route_attributes(route, policy="cache_aware", num_images=2, num_prompt_tokens=60)
    assert attributes["tessera.route.images_from_other_holders"] == 1
    assert "1 image(s) shipped by other holders" in attributes["tessera.route.reason"]
