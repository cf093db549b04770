"""The router over a real index backend (in-process): prefix reporting, placement, and candidates
from the membership (live nodes only, minus the ones a request saw fail)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from services.router.membership import Membership
from services.router.policies import SERVED_POLICIES as POLICIES
from services.router.policies import make_policy
from services.router.route import NoLiveNodeError
from services.router.router import Router
from services.router.scoring import PIN_LOAD_SLACK
from shared.hashing import MmSpan, block_hashes
from shared.index.memory_backend import InProcessIndex
from shared.index.reader import LocalReader
from shared.index.record_seal import RecordSealer
from shared.index.sealed_index import SealedIndex
from shared.index.types import IndexEvents, IndexUnavailableError, MmEntry, NodeInfo
from shared.types import MmHash, PlaceholderRange

BLOCK = 4
STATIC = {"encoder": ("e:1", "e:2"), "prefill": ("p:1", "p:2"), "decode": ("d:1", "d:2")}
ALL_NODES = [f"{role}@{a}" for role, addresses in STATIC.items() for a in addresses]
TOKENS = list(range(40))  # 10 full blocks
IMAGE = (MmHash("img"), PlaceholderRange(8, 12))
HASHES = block_hashes(TOKENS, BLOCK, [MmSpan(*IMAGE)])


def router_over(index, *, policy: str = "cache_aware", **kwargs) -> Router:
    membership = Membership(LocalReader(index))
    asyncio.run(membership.refresh())  # what start() does first; the lookups then name holders only
    return Router(membership, make_policy(policy), index=LocalReader(index), block_size=BLOCK, **kwargs)


def index_holding(node_to_blocks: dict[str, list[int]], *, everyone: bool = True) -> InProcessIndex:
    """An index where node "role@address" holds the listed blocks of TOKENS; with ``everyone``,
    every node of STATIC is live too."""
    index = InProcessIndex()
    if everyone:
        node_to_blocks = {**{n: [] for n in ALL_NODES}, **node_to_blocks}
    for node_id, blocks in node_to_blocks.items():
        role, address = node_id.split("@")
        epoch = index.register_node(NodeInfo(node_id, role, address), ttl_s=60)
        index.publish(node_id, epoch, IndexEvents(kv_stored={HASHES[i]: "device" for i in blocks}))
    return index


@pytest.mark.parametrize("policy", POLICIES)
def test_route_reports_leading_tokens_of_every_live_prefill_and_decode_node(policy):
    index = index_holding(
        {
            "prefill@p:1": list(range(10)),
            "prefill@p:2": [0, 1, 2, 5],  # its prefix ends at its first missing block
            "decode@d:1": [0, 1],
            "decode@d:2": [3, 4],  # no block 0: no prefix
            "encoder@e:1": [0, 1, 2],  # encoders hold no reusable KV
        }
    )
    route = asyncio.run(router_over(index, policy=policy).route(TOKENS, [IMAGE]))
    assert route.prefix_tokens_by_node == {"p:1": 40, "p:2": 12, "d:1": 8}


def test_cache_aware_places_prefill_on_the_longest_prefix():
    index = index_holding({"prefill@p:1": [0, 1], "prefill@p:2": list(range(6))})
    assert asyncio.run(router_over(index).route(TOKENS, [IMAGE])).prefill == "p:2"


def test_blocks_of_another_image_or_salt_are_not_a_prefix():
    index = index_holding({"prefill@p:1": list(range(10))})
    router = router_over(index)
    other_image = (MmHash("other"), IMAGE[1])
    assert asyncio.run(router.route(TOKENS, [other_image])).prefix_tokens_by_node == {"p:1": 8}  # blocks before the image
    assert asyncio.run(router.route(TOKENS, [IMAGE], cache_salt="tenant")).prefix_tokens_by_node == {}


def test_precomputed_block_hashes_give_the_same_route():
    index = index_holding({"prefill@p:1": [0, 1], "prefill@p:2": list(range(6)), "decode@d:2": [0]})
    router = router_over(index)
    computed = asyncio.run(router.route(TOKENS, [IMAGE]))
    given = asyncio.run(router.route(TOKENS, [IMAGE], block_hashes=HASHES))
    assert (given.prefill, given.prefix_tokens_by_node) == (computed.prefill, computed.prefix_tokens_by_node)
    assert index.num_round_trips == 2  # one lookup per route, hashes given or not


def test_a_holder_whose_record_the_membership_refused_is_credited_with_nothing():
    """A lookup names holders by id and epoch; only the membership's (sealed) records make them
    count, so a forged record holding the whole prompt draws nothing."""
    inner = InProcessIndex(namespace="tiny@abc")
    index = SealedIndex(inner, RecordSealer(b"k" * 16, "tiny@abc"))
    for node_id in ALL_NODES:
        role, address = node_id.split("@")
        epoch = index.register_node(NodeInfo(node_id, role, address), ttl_s=60)
        index.publish(node_id, epoch, IndexEvents(kv_stored={HASHES[0]: "device"}) if role == "prefill" else IndexEvents())
    forged = inner.register_node(NodeInfo("prefill@p:9", "prefill", "p:9"), ttl_s=60)  # past the seal
    held = IndexEvents(mm_stored={IMAGE[0]: MmEntry(12, (1, 6, 8), 64)}, kv_stored=dict.fromkeys(HASHES, "device"))
    inner.publish("prefill@p:9", forged, held)
    assert "prefill@p:9" in index.lookup([IMAGE[0]], HASHES).node_to_epoch  # named by the lookup
    route = asyncio.run(router_over(index).route(TOKENS, [IMAGE]))
    assert route.prefix_tokens_by_node == {"p:1": 4, "p:2": 4} and route.prefill in ("p:1", "p:2") and not route.image_to_source


class DownIndex(InProcessIndex):
    def lookup(self, mm_hashes, block_hashes):
        raise IndexUnavailableError("down")


def test_without_an_index_no_prefix_is_reported_and_routing_still_works():
    assert asyncio.run(Router(Membership(None, STATIC)).route(TOKENS, [IMAGE])).prefix_tokens_by_node == {}
    index = DownIndex()
    for node_id in ALL_NODES:
        role, address = node_id.split("@")
        index.register_node(NodeInfo(node_id, role, address), ttl_s=60)
    membership = Membership(LocalReader(index))
    asyncio.run(membership.refresh())  # the last-known set, kept through the outage
    router = Router(membership, index=LocalReader(index))
    route = asyncio.run(router.route(TOKENS, [IMAGE]))
    assert route.prefix_tokens_by_node == {} and route.prefill in STATIC["prefill"] and router.num_index_failures == 1


@pytest.mark.parametrize("policy", POLICIES)
def test_nodes_whose_heartbeat_lapsed_are_not_candidates(policy):
    index = index_holding({"encoder@e:1": [], "prefill@p:2": [], "decode@d:1": []}, everyone=False)  # e:2, p:1, d:2 silent
    router = router_over(index, policy=policy)
    for _ in range(4):
        route = asyncio.run(router.route(TOKENS, [IMAGE]))
        assert (route.encoder, route.prefill, route.decode) == ("e:1", "p:2", "d:1")


def test_a_node_that_joins_is_a_candidate_on_the_next_route():
    index = index_holding({"encoder@e:1": [], "prefill@p:1": [], "decode@d:1": []}, everyone=False)
    router = router_over(index, policy="round_robin")
    assert {asyncio.run(router.route(TOKENS, [IMAGE])).encoder for _ in range(4)} == {"e:1"}
    index.register_node(NodeInfo("encoder@e:9", "encoder", "e:9"), ttl_s=60)
    assert {asyncio.run(router.route(TOKENS, [IMAGE])).encoder for _ in range(4)} == {"e:1", "e:9"}


def test_excluded_nodes_are_skipped_and_a_role_with_none_left_raises():
    router = router_over(index_holding({}), policy="round_robin")
    for _ in range(4):
        assert asyncio.run(router.route(TOKENS, [IMAGE], exclude=frozenset({"d:1", "p:2"}))).decode == "d:2"
    with pytest.raises(NoLiveNodeError, match="no live encoder node"):
        asyncio.run(router.route(TOKENS, [IMAGE], exclude=frozenset({"e:1", "e:2"})))


@pytest.mark.parametrize("policy", [*POLICIES, "llmd"])
def test_a_request_routed_without_decode_names_none_and_needs_no_decode_node(policy):
    """An embedding ends at its prefill: a cluster without decode nodes serves it, and its
    reservation counts work on the encoder and prefill node only."""
    index = index_holding({n: [] for n in ALL_NODES if not n.startswith("decode")}, everyone=False)
    router = router_over(index, policy="round_robin")
    router.policy = make_policy(policy, llmd_lru_blocks=64)
    route = asyncio.run(router.route(TOKENS, [IMAGE], decode=False, reserve=True))
    assert route.decode is None and route.prefill in ("p:1", "p:2")
    assert router.membership.work_on("d:1").num_calls == 0 and router.membership.work_on(route.prefill).num_calls == 1
    route.reservation.release()
    with pytest.raises(NoLiveNodeError, match="no live decode node"):
        asyncio.run(router.route(TOKENS, [IMAGE]))


def test_this_gateways_requests_in_flight_count_as_load_before_any_heartbeat_shows_them():
    router = router_over(index_holding({}), policy="least_loaded")
    with router.membership.in_flight("d:1"), router.membership.in_flight("d:1"), router.membership.in_flight("d:2"):
        assert {asyncio.run(router.route(TOKENS, [IMAGE])).decode for _ in range(3)} == {"d:2"}


def _cluster(*, can_encode: bool, encoder_heartbeat_load: float = 0.0) -> InProcessIndex:
    """Every node of STATIC live; prefill nodes with a vision tower when ``can_encode``."""
    index = InProcessIndex()
    for node_id in ALL_NODES:
        role, address = node_id.split("@")
        epoch = index.register_node(NodeInfo(node_id, role, address, can_encode=role == "prefill" and can_encode), ttl_s=60)
        load = encoder_heartbeat_load if role == "encoder" else 0.0
        index.heartbeat(node_id, epoch, load=load, kv_usage=0.0, ttl_s=60)
    return index


def test_a_request_naming_an_adapter_routes_to_the_nodes_whose_records_say_they_serve_it():
    index = _cluster(can_encode=False)
    for node_id in ("prefill@p:2", "decode@d:2"):
        epoch = index.live_nodes()[node_id].epoch
        index.heartbeat(node_id, epoch, load=1.0, kv_usage=0.0, ttl_s=60, adapters=frozenset({"fp-a"}))
    router = router_over(index)
    route = asyncio.run(router.route(TOKENS, [IMAGE], lora_id="fp-a"))
    assert (route.prefill, route.decode) == ("p:2", "d:2")
    other = asyncio.run(router.route(TOKENS, [IMAGE], lora_id="fp-b"))  # no node serves it: by load, as the base model
    assert (other.prefill, other.decode) == ("p:1", "d:1")


def test_an_encoder_serving_the_requests_adapter_is_preferred_only_for_an_adapter_on_the_tower():
    index = _cluster(can_encode=False)
    epoch = index.live_nodes()["encoder@e:2"].epoch
    index.heartbeat("encoder@e:2", epoch, load=1.0, kv_usage=0.0, ttl_s=60, adapters=frozenset({"fp-t"}))
    router = router_over(index)
    assert asyncio.run(router.route(TOKENS, [IMAGE], lora_id="fp-t", lora_tower=True)).encoder == "e:2"
    assert asyncio.run(router.route(TOKENS, [IMAGE], lora_id="fp-t")).encoder == "e:1"  # by load: its embeddings are the base's


def _queued(router: Router, num_calls: int) -> contextlib.ExitStack:
    """``num_calls`` of this gateway's calls in flight on every encoder."""
    stack = contextlib.ExitStack()
    for _ in range(num_calls):
        stack.enter_context(router.membership.in_flight("e:1", "e:2"))
    return stack


def test_images_go_to_a_prefill_node_that_can_encode_while_the_encoders_are_queued():
    router = router_over(_cluster(can_encode=True))
    with _queued(router, 4):
        route = asyncio.run(router.route(TOKENS, [IMAGE]))
    assert route.local_encode == {IMAGE[0]} and router.num_local_encodes == 1


def test_images_stay_on_the_encoder_tier_when_it_is_idle_or_prefill_cannot_encode():
    assert asyncio.run(router_over(_cluster(can_encode=True)).route(TOKENS, [IMAGE])).local_encode == set()
    # A heartbeat's load may be ttl/3 old: alone it never sends images away from an idle encoder.
    assert asyncio.run(router_over(_cluster(can_encode=True, encoder_heartbeat_load=4)).route(TOKENS, [IMAGE])).local_encode == set()
    for router in (router_over(_cluster(can_encode=False)), router_over(_cluster(can_encode=True), encode_dispatch="encoder")):
        with _queued(router, 4):
            assert asyncio.run(router.route(TOKENS, [IMAGE])).local_encode == set()


def test_an_image_the_chosen_encoder_holds_is_never_encoded_again():
    index = _cluster(can_encode=True)
    for node_id in ("encoder@e:1", "encoder@e:2"):
        epoch = index.live_nodes()[node_id].epoch
        index.publish(node_id, epoch, IndexEvents(mm_stored={IMAGE[0]: MmEntry(12, (1, 4, 12), 12 * 64)}))
    route = asyncio.run(router_over(index, encode_dispatch="prefill").route(TOKENS, [IMAGE]))
    assert route.images_on_encoder == {IMAGE[0]} and route.local_encode == set()


def test_images_held_by_two_encoders_are_each_shipped_by_a_holder_and_none_is_encoded_again():
    """A route names one encoder; an image only another encoder holds is shipped from that one
    (Route.image_to_source), not encoded again on the chosen one, and its pixels are never pushed."""
    index = _cluster(can_encode=True)
    second = (MmHash("img-2"), PlaceholderRange(24, 12))
    entry = MmEntry(12, (1, 4, 12), 12 * 64)
    for node_id, held in (("encoder@e:1", IMAGE[0]), ("encoder@e:2", second[0])):
        index.publish(node_id, index.live_nodes()[node_id].epoch, IndexEvents(mm_stored={held: entry}))
    route = asyncio.run(router_over(index, encode_dispatch="prefill").route(TOKENS, [IMAGE, second], reserve=True))
    other = {"e:1": "e:2", "e:2": "e:1"}[route.encoder]
    (shipped,) = {IMAGE[0], second[0]} - route.images_on_encoder
    assert route.image_to_source == {shipped: other} and route.local_encode == set()
    assert route.reservation is not None
    route.reservation.release()
    excluded = asyncio.run(router_over(index).route(TOKENS, [IMAGE, second], exclude=frozenset({other})))
    assert excluded.image_to_source == {}  # a holder the request must avoid ships nothing
    assert asyncio.run(router_over(index, policy="least_loaded").route(TOKENS, [IMAGE, second])).image_to_source == {}


def test_an_image_only_the_other_prefill_node_holds_is_shipped_by_it():
    index = _cluster(can_encode=True)
    second = (MmHash("img-2"), PlaceholderRange(24, 12))
    entry = MmEntry(12, (1, 4, 12), 12 * 64)
    for node_id, held in (("prefill@p:1", IMAGE[0]), ("prefill@p:2", second[0])):
        index.publish(node_id, index.live_nodes()[node_id].epoch, IndexEvents(mm_stored={held: entry}))
    route = asyncio.run(router_over(index).route(TOKENS, [IMAGE, second]))
    other = {"p:1": "p:2", "p:2": "p:1"}[route.prefill]
    (shipped,) = {IMAGE[0], second[0]} - route.images_on_prefill
    assert route.image_to_source == {shipped: other} and route.local_encode == set()


def test_an_unknown_encode_dispatch_is_refused():
    with pytest.raises(ValueError, match="unknown encode dispatch"):
        router_over(InProcessIndex(), encode_dispatch="gpu")


def test_an_image_the_prefill_node_holds_needs_no_encoder_and_draws_the_request():
    index = _cluster(can_encode=True)
    epoch = index.live_nodes()["prefill@p:2"].epoch
    index.publish("prefill@p:2", epoch, IndexEvents(mm_stored={IMAGE[0]: MmEntry(12, (1, 4, 12), 12 * 64)}))
    router = router_over(index)
    with _queued(router, 4):
        route = asyncio.run(router.route(TOKENS, [IMAGE]))
    assert route.prefill == "p:2" and route.images_on_prefill == {IMAGE[0]}
    assert route.local_encode == set() and route.images_on_encoder == set()


def test_a_prefill_holder_past_the_pin_slack_is_no_longer_pinned():
    """Bounded pinning (scoring.PIN_LOAD_SLACK): a holder loaded past the least loaded prefill node
    by more than the slack loses the pin; the image is encoded again rather than queued there."""
    index = _cluster(can_encode=True)
    epoch = index.live_nodes()["prefill@p:2"].epoch
    index.publish("prefill@p:2", epoch, IndexEvents(mm_stored={IMAGE[0]: MmEntry(12, (1, 4, 12), 12 * 64)}))
    router = router_over(index)
    with router.membership.in_flight(*["p:2"] * int(PIN_LOAD_SLACK)):
        assert asyncio.run(router.route(TOKENS, [IMAGE])).prefill == "p:2"  # within the slack: still pinned
    with router.membership.in_flight(*["p:2"] * (int(PIN_LOAD_SLACK) + 1)):
        route = asyncio.run(router.route(TOKENS, [IMAGE]))
    assert route.prefill == "p:1" and route.images_on_prefill == set()


def test_calls_waiting_on_the_encoder_do_not_make_a_prefill_node_busy_but_its_local_encodes_do():
    router = router_over(_cluster(can_encode=True))
    with _queued(router, 1), router.membership.in_flight("p:1", "p:2", "p:1", "p:2"):  # these wait on the encoder tier
        assert asyncio.run(router.route(TOKENS, [IMAGE])).local_encode == {IMAGE[0]}
        with router.membership.in_flight(local_encodes=("p:1", "p:2")):
            # One local encode running on each: T * 1 is not below 1 * mean_call_tokens (= T).
            assert asyncio.run(router.route(TOKENS, [IMAGE])).local_encode == set()


def test_a_burst_routed_before_any_call_starts_spreads_its_images_over_encoders_and_prefill_nodes():
    """Requests routed with reserve=True count on their nodes at once: the third and fourth cold
    image of a burst see both encoders queued and are encoded on a prefill node."""
    router = router_over(_cluster(can_encode=True))
    images = [(MmHash(f"cold-{i}"), PlaceholderRange(8, 28)) for i in range(4)]
    routes = [asyncio.run(router.route(TOKENS, [image], reserve=True)) for image in images]
    assert [bool(r.local_encode) for r in routes] == [False, False, True, True]
    assert {r.encoder for r in routes[:2]} == {"e:1", "e:2"}
    assert {r.prefill for r in routes[2:]} == {"p:1", "p:2"}  # one local encode each
    for route in routes:
        assert route.reservation is not None
        route.reservation.release()
        route.reservation.release()  # a second release is a no-op
    assert all(router.membership.num_in_flight(a) == 0 for a in ("e:1", "e:2", "p:1", "p:2", "d:1", "d:2"))
    assert router.membership.work_on("p:1").num_local_encodes == 0


def test_a_prefill_node_owing_the_burst_s_prefills_takes_one_image_not_half_of_them():
    """One encoder and one prefill node (a 1/1/1 stack), four cold images at once: every prompt
    is prefilled on p whatever happens to its image, so p takes one image and e three. Weighing
    only p's local encodes, it took two, and p then had two encodes and four prefills to run."""
    index = InProcessIndex()
    for node_id, role in (("encoder@e:1", "encoder"), ("prefill@p:1", "prefill"), ("decode@d:1", "decode")):
        epoch = index.register_node(NodeInfo(node_id, role, node_id.split("@")[1], can_encode=role == "prefill"), ttl_s=60)
        index.heartbeat(node_id, epoch, load=0.0, kv_usage=0.0, ttl_s=60)
    router = router_over(index)
    images = [(MmHash(f"cold-{i}"), PlaceholderRange(8, 28)) for i in range(4)]
    routes = [asyncio.run(router.route(TOKENS, [image], reserve=True)) for image in images]
    assert [bool(r.local_encode) for r in routes] == [False, True, False, False]
    assert router.membership.work_on("p:1").num_pending_tokens == 4 * len(TOKENS)
    for route in routes:
        assert route.reservation is not None
        route.reservation.release()
    assert router.membership.work_on("p:1").num_pending_tokens == 0


def test_a_route_reserves_only_the_nodes_its_work_uses():
    router = router_over(_cluster(can_encode=True))
    with _queued(router, 4):
        route = asyncio.run(router.route(TOKENS, [IMAGE], reserve=True))
        assert route.local_encode == {IMAGE[0]} and route.reservation is not None
        with route.reservation:  # the prefill node encodes the image: the encoder is not counted
            assert router.membership.num_in_flight(route.encoder) == 4
            assert router.membership.work_on(route.prefill).num_local_encodes == 1
            assert router.membership.num_in_flight(route.prefill) == router.membership.num_in_flight(route.decode) == 1
        assert router.membership.num_in_flight(route.prefill) == 0
    assert asyncio.run(router.route(TOKENS, [IMAGE])).reservation is None  # reserve=False: nothing counted


def test_a_stale_prefill_heartbeat_does_not_keep_images_off_an_idle_prefill_node():
    """A prefill node's heartbeat load may be ttl/3 old (a warm-up that just finished): busy(p)
    counts only this gateway's local encodes on it, which are exact."""
    index = _cluster(can_encode=True)
    for node_id in ("prefill@p:1", "prefill@p:2"):
        index.heartbeat(node_id, index.live_nodes()[node_id].epoch, load=4.0, kv_usage=0.0, ttl_s=60)
    router = router_over(index)
    with _queued(router, 1):
        assert asyncio.run(router.route(TOKENS, [IMAGE])).local_encode == {IMAGE[0]}


def test_a_large_role_scores_its_holders_and_a_bounded_random_draw_of_the_rest():
    from services.router.router import MAX_SCORED_NODES

    many = {f"encoder@e:{i}": [] for i in range(3 * MAX_SCORED_NODES)}
    index = index_holding({**many, "prefill@p:7": list(range(10))})
    for i in range(3 * MAX_SCORED_NODES):
        index.register_node(NodeInfo(f"prefill@p:{100 + i}", "prefill", f"p:{100 + i}"), ttl_s=60)
    router = router_over(index)
    seen_encoders = set()
    for _ in range(20):
        route = asyncio.run(router.route(TOKENS, [IMAGE]))
        assert route.prefill == "p:7", "the holder of the whole prefix is always scored, and wins"
        seen_encoders.add(route.encoder)
    candidates = router._candidates("prefill", frozenset(), 0, {"p:7": 40})
    assert len(candidates) == MAX_SCORED_NODES + 1 and "p:7" in {c.node_id for c in candidates}
    assert len(seen_encoders) > 1, "the draw changes with the turn"
    round_robin = router_over(index, policy="round_robin")
    assert len(round_robin._candidates("encoder", frozenset(), 0)) == len({*many, *(n for n in ALL_NODES if n.startswith("encoder"))})


def test_a_second_request_for_an_image_being_encoded_goes_where_it_is_encoded_and_sends_nothing():
    """Exactly-once encoding: the index lists no holder until the first encode ends, but the
    router knows where it sent the image (pending_encodes.py)."""
    router = router_over(_cluster(can_encode=True))
    first = asyncio.run(router.route(TOKENS, [IMAGE], reserve=True))
    assert first.local_encode == set() and IMAGE[0] not in first.images_on_encoder  # to be encoded on first.encoder
    for _ in range(3):  # however busy its encoder now looks
        second = asyncio.run(router.route(TOKENS, [IMAGE], reserve=True))
        assert second.encoder == first.encoder and IMAGE[0] in second.images_on_encoder and second.local_encode == set()
    assert first.reservation is not None
    first.reservation.release()


def test_a_second_request_for_an_image_a_prefill_node_encodes_goes_to_that_prefill_node():
    router = router_over(_cluster(can_encode=True))
    with _queued(router, 4):
        first = asyncio.run(router.route(TOKENS, [IMAGE], reserve=True))
        second = asyncio.run(router.route(TOKENS, [IMAGE], reserve=True))
    assert first.local_encode == {IMAGE[0]}
    assert second.prefill == first.prefill and IMAGE[0] in second.images_on_prefill and second.local_encode == set()


def test_an_image_pending_on_a_node_the_request_must_avoid_is_encoded_again_elsewhere():
    """A pending encode is a hint, never a lock: a node that failed (or died mid-encode) is not a
    candidate, and the image is encoded on another."""
    router = router_over(_cluster(can_encode=False))
    first = asyncio.run(router.route(TOKENS, [IMAGE], reserve=True))
    retry = asyncio.run(router.route(TOKENS, [IMAGE], exclude=frozenset({first.encoder}), reserve=True))
    assert retry.encoder != first.encoder and IMAGE[0] not in retry.images_on_encoder


def test_an_image_the_prefill_prefix_covers_is_neither_encoded_shipped_nor_pending_and_draws_the_request():
    """IMAGE spans tokens 8..20: p:2's five cached blocks (20 tokens) cover it whole, though no
    node holds its embeddings any more; p:1's four blocks cut it."""
    index = index_holding({"prefill@p:1": [0, 1, 2, 3], "prefill@p:2": [0, 1, 2, 3, 4]})
    router = router_over(index, encode_dispatch="prefill")
    route = asyncio.run(router.route(TOKENS, [IMAGE], reserve=True))
    assert route.prefill == "p:2" and route.images_covered == {IMAGE[0]}
    assert route.local_encode == set() and route.image_to_source == {} and router.num_images_covered == 1
    assert router.pending_encodes.where([IMAGE[0]]) == {}  # nothing sent to be encoded
    route.reservation.release()
    cut = index_holding({"prefill@p:1": [0, 1, 2, 3]})
    assert asyncio.run(router_over(cut).route(TOKENS, [IMAGE])).images_covered == frozenset()


def test_a_route_counts_its_new_images_tokens_on_the_encoder_until_released():
    router = router_over(index_holding({}))
    route = asyncio.run(router.route(TOKENS, [IMAGE], reserve=True))
    assert router.membership.work_on(route.encoder).num_encode_tokens == IMAGE[1].length
    route.reservation.release()
    assert router.membership.work_on(route.encoder).num_encode_tokens == 0
