"""Routes one request: one index lookup, then a pure choice per role (see scoring.py).

Candidates are the live nodes of each role from Membership (the index's node records), minus the
nodes this request already saw fail; the lookup adds what each node holds, naming holders by id
and epoch, which the membership resolves to its records (a name it does not hold counts for
nothing). Without an index (or while it is unreachable) the candidates are the static or
last-known nodes with no cached work, so cache_aware degrades to tie-breaking and the other
policies still work. Decode placement ignores caches (the prompt's KV is shipped from prefill):
cache_aware places decode least-loaded. Whatever the policy, when cache lookups are on
the route reports how many leading prompt tokens each live prefill and decode node holds, so the
caller can pull a prefix from a peer instead of recomputing it. Adaptive dispatch (scoring.py)
then says whether the chosen prefill node encodes the images the chosen encoder lacks.

Exactly-once encoding (cache_aware): a node holding one of the request's images pins the request
there (the encoder holding the most image tokens, whatever its load; then, for the images that
encoder lacks, the prefill node holding the most, while its load is within scoring.py's
PIN_LOAD_SLACK of the least loaded), since handing over held embeddings costs far less than a
tower run. An image neither pinned node holds but another encoder or prefill node does is
shipped from that one (``Route.image_to_source``). An image this gateway has sent to be encoded
and the index does not list yet counts as held where it was sent (pending_encodes.py).

Power of d choices: past MAX_SCORED_NODES nodes of a role, cache_aware and least_loaded score
the nodes holding the request's work plus MAX_SCORED_NODES others drawn at random (seeded by
the request's turn), not the whole role. The least loaded of d random nodes is nearly as good as
the least loaded of all (Mitzenmacher), and a decision then costs the same at 500 nodes as at
20: the draw itself takes O(holders + d) nodes, never the role's list (Membership.sample).
round_robin always sees every node.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace

from services.router.membership import InFlight, Membership
from services.router.pending_encodes import PendingEncodes
from services.router.scoring import (
    ENCODE_DISPATCHES,
    POLICIES,
    Candidate,
    choose,
    encode_on_prefill,
    image_tokens_per_node,
    prefill_tokens_per_node,
    prefix_tokens_per_node,
    within_pin_slack,
)
from shared.hashing import MmSpan
from shared.hashing import block_hashes as compute_block_hashes
from shared.index.backend import CacheIndex
from shared.index.types import IndexUnavailableError, LookupResult, NodeState
from shared.types import BlockHash, MmHash, PlaceholderRange

MAX_SCORED_NODES = 16


class NoLiveNodeError(RuntimeError):
    def __init__(self, role: str) -> None:
        super().__init__(f"no live {role} node is left")
        self.role = role


@dataclass(frozen=True, slots=True)
class Route:
    encoder: str
    prefill: str
    decode: str
    images_on_encoder: frozenset[MmHash]  # mm_hashes the chosen encoder holds, per the index
    # gRPC address of each live prefill or decode node holding a leading prefix of the prompt's
    # blocks -> leading prompt tokens it holds (block_size * leading blocks); empty without an index.
    prefix_tokens_by_node: dict[str, int]
    decision_s: float
    # Images the prefill node encodes itself (adaptive dispatch): their pixels go to it, not to
    # the encoder. Empty: every image the encoder lacks is encoded there.
    local_encode: frozenset[MmHash] = frozenset()
    images_on_prefill: frozenset[MmHash] = frozenset()  # embeddings the chosen prefill node holds, per the index
    # Images neither the chosen encoder nor the prefill node holds but another live encoder or
    # prefill node does (or is encoding): mm_hash -> that node, asked to ship the embeddings
    # instead of a new tower run (the encoder encodes what it no longer holds).
    image_to_source: dict[MmHash, str] = field(default_factory=dict)
    # With route(reserve=True): this gateway's in-flight count of the route's work on its nodes,
    # and the images it sends to be encoded, taken with the decision; the caller releases it when
    # its prefill ends.
    reservation: Reservation | None = None


class Reservation:
    """A route's work counted on its nodes and its images pending encode; released once, however
    often ``release`` is called (a with-block's exit and a failure path may both do it)."""

    __slots__ = ("_end_encodes", "_in_flight")

    def __init__(self, in_flight: InFlight, end_encodes: Callable[[], None]) -> None:
        self._in_flight, self._end_encodes = in_flight, end_encodes

    def release(self) -> None:
        self._in_flight.release()
        self._end_encodes()

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


@dataclass(slots=True)
class Router:
    membership: Membership
    policy: str = "cache_aware"
    index: CacheIndex | None = None  # None: no cache lookups (the membership may still use one)
    block_size: int = 16
    encode_dispatch: str = "adaptive"
    _turns: itertools.count = field(default_factory=itertools.count)
    num_index_failures: int = 0
    num_local_encodes: int = 0  # requests whose images the prefill node was chosen to encode
    mean_call_tokens: float = 0.0  # moving average of the image tokens per request sent to encoders
    pending_encodes: PendingEncodes = field(default_factory=PendingEncodes)
    _decide_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown routing policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.encode_dispatch not in ENCODE_DISPATCHES:
            raise ValueError(f"unknown encode dispatch {self.encode_dispatch!r}; choose one of {', '.join(ENCODE_DISPATCHES)}")

    def route(
        self,
        token_ids: list[int],
        images: list[tuple[MmHash, PlaceholderRange]],
        cache_salt: str | None = None,
        block_hashes: list[BlockHash] | None = None,
        exclude: frozenset[str] = frozenset(),
        *,
        reserve: bool = False,
    ) -> Route:
        """``block_hashes``: the prompt's block hashes when the caller already has them (they must
        be shared.hashing.block_hashes of the same tokens, images and salt at this block_size).
        ``exclude``: gRPC addresses of nodes that already failed this request. Raises
        NoLiveNodeError when a role has no candidate left. ``reserve``: count the route's work
        as in flight on its nodes (``Route.reservation``) in the same step as the decision."""
        started = time.perf_counter()
        turn = next(self._turns)
        hashes: list[BlockHash] = []
        if self.index is not None:
            if block_hashes is not None:
                hashes = block_hashes
            else:
                hashes = compute_block_hashes(token_ids, self.block_size, [MmSpan(h, r) for h, r in images], cache_salt=cache_salt)
        lookup = self._lookup([h for h, _ in images], hashes)
        named: dict[str, NodeState] = {}
        if lookup is not None:
            self.membership.note_version(lookup.membership_version)
            named = self.membership.resolve(lookup.node_to_epoch)
        tie_key = images[0][0] if images else ""
        image_tokens = {h: r.length for h, r in images}
        mm_holders = (
            {h: {named[n].info.grpc_address: e for n, e in holders.items() if n in named} for h, holders in lookup.mm_holders.items()}
            if lookup
            else {}
        )
        prefix_tokens = self._prefix_tokens_by_node(lookup, named)
        # Decide and count the work in one step: requests of a burst (cold images arriving
        # together) each see the load of those routed before them, and the images they sent to
        # be encoded (pending_encodes.py). Counted only after their pixels were pushed, all of
        # them saw the same idle encoder and queued there.
        with self._decide_lock:
            pending = self.pending_encodes.where(h for h, _ in images if not mm_holders.get(h))
            for mm_hash, address in pending.items():
                mm_holders.setdefault(mm_hash, {})[address] = None
            prefill_tokens = prefill_tokens_per_node(prefix_tokens, mm_holders, images)
            encoder_tokens = image_tokens_per_node(mm_holders, image_tokens)
            encoders = self._candidates("encoder", exclude, turn, encoder_tokens)
            encoder = self._pinned(encoder_tokens, encoders) or choose(self.policy, encoders, encoder_tokens, turn=turn, tie_key=tie_key)
            prefills = self._candidates("prefill", exclude, turn, prefill_tokens)
            elsewhere = {h: holders for h, holders in mm_holders.items() if encoder not in holders}
            prefill = self._pinned(image_tokens_per_node(elsewhere, image_tokens), prefills, bounded=True) or choose(
                self.policy, prefills, prefill_tokens, turn=turn, tie_key=tie_key
            )
            decode_policy = "least_loaded" if self.policy == "cache_aware" else self.policy
            decode = choose(decode_policy, self._candidates("decode", exclude, turn), {}, turn=turn)
            held = frozenset(h for h, holders in mm_holders.items() if encoder in holders)
            on_prefill = frozenset(h for h, holders in mm_holders.items() if prefill in holders)
            new = [h for h, _ in images if h not in held and h not in on_prefill]
            shipped = self._other_holders(new, mm_holders, [*encoders, *prefills], {encoder, prefill})
            new = [h for h in new if h not in shipped]
            local = self._local_encode(new, image_tokens, _find(encoders, encoder), _find(prefills, prefill))
            route = Route(encoder, prefill, decode, held, prefix_tokens, time.perf_counter() - started, local, on_prefill, shipped)
            if not reserve:
                return route
            pending = {pending_tokens_key(prefill): max(0, len(token_ids) - prefix_tokens.get(prefill, 0))}
            in_flight = self.membership.in_flight(*work_keys(route, [h for h, _ in images]), amounts=pending)
            end_encodes = self.pending_encodes.begin({h: prefill if h in local else encoder for h in new})
            return replace(route, reservation=Reservation(in_flight, end_encodes))

    def _local_encode(
        self, new: list[MmHash], image_tokens: dict[MmHash, int], encoder: Candidate, prefill: Candidate
    ) -> frozenset[MmHash]:
        """The images (those the encoder lacks) the prefill node encodes itself, and the moving
        average of the image tokens sent to encoders that the decision weighs queued calls by."""
        num_new_tokens = sum(image_tokens[h] for h in set(new))
        if num_new_tokens == 0:
            return frozenset()
        mean = self.mean_call_tokens or float(num_new_tokens)
        if encode_on_prefill(self.encode_dispatch, num_new_tokens, encoder, prefill, mean):
            self.num_local_encodes += 1
            return frozenset(new)
        self.mean_call_tokens = 0.9 * mean + 0.1 * num_new_tokens
        return frozenset()

    def _pinned(self, held_tokens: dict[str, int], candidates: list[Candidate], *, bounded: bool = False) -> str | None:
        """cache_aware: the candidate holding (or encoding) the most of the request's image
        tokens (``held_tokens``: node -> tokens it holds), if any holds one. Such images go there
        whatever its load: handing over embeddings a node holds costs little, and encoding them
        again elsewhere costs a tower run (exactly-once encoding)."""
        if self.policy != "cache_aware":
            return None
        holders = sorted(
            c.node_id for c in candidates if held_tokens.get(c.node_id, 0) > 0 and (not bounded or within_pin_slack(c, candidates))
        )
        return max(holders, key=held_tokens.__getitem__) if holders else None

    def _other_holders(
        self, images: list[MmHash], mm_holders: dict[MmHash, dict], candidates: list[Candidate], chosen: set[str]
    ) -> dict[MmHash, str]:
        """cache_aware: for each of ``images`` (those the chosen encoder and prefill node lack)
        that other candidate encoders or prefill nodes hold or are encoding, the least loaded of
        them (then the lowest address): a route names one encoder and one prefill node, and a
        session's images can be held by several nodes."""
        if self.policy != "cache_aware":
            return {}
        others = {c.node_id: c for c in candidates if c.node_id not in chosen}
        out: dict[MmHash, str] = {}
        for mm_hash in dict.fromkeys(images):
            holders = [others[a] for a in mm_holders.get(mm_hash, {}) if a in others]
            if holders:
                out[mm_hash] = min(holders, key=lambda c: (c.load, c.node_id)).node_id
        return out

    def _prefix_tokens_by_node(self, lookup: LookupResult | None, named: dict[str, NodeState]) -> dict[str, int]:
        """``named``: the lookup's holders the membership holds (Membership.resolve)."""
        if lookup is None:
            return {}
        # Only prefill and decode nodes hold KV pages a request can reuse.
        node_to_num_blocks = {
            named[node_id].info.grpc_address: num_blocks
            for node_id, num_blocks in lookup.node_to_num_prefix_blocks.items()
            if node_id in named and named[node_id].info.role in ("prefill", "decode")
        }
        return prefix_tokens_per_node(node_to_num_blocks, self.block_size)

    def _lookup(self, mm_hashes: list[MmHash], hashes: list[BlockHash]) -> LookupResult | None:
        if self.index is None:  # cache lookups off: the membership refreshes itself
            return None
        try:
            return self.index.lookup(mm_hashes, hashes)
        except IndexUnavailableError:
            self.num_index_failures += 1
            return None

    def _candidates(self, role: str, exclude: frozenset[str], turn: int, holders: Collection[str] = ()) -> list[Candidate]:
        """The role's nodes to score: all of them, or past MAX_SCORED_NODES the holders of the
        request's work and a random draw of the others (the module's header says why)."""
        nodes = None
        if self.policy != "round_robin":
            nodes = self.membership.sample(role, exclude=exclude, holders=holders, k=MAX_SCORED_NODES, rng=random.Random(turn))
        if nodes is None:
            nodes = self.membership.nodes(role, exclude=exclude)
        if not nodes:
            raise NoLiveNodeError(role)
        return [self._candidate(s) for s in nodes]

    def _candidate(self, state: NodeState) -> Candidate:
        address = state.info.grpc_address
        in_flight = self.membership.num_in_flight(address)
        busy = self.membership.num_in_flight(local_encode_key(address))
        pending = self.membership.num_in_flight(pending_tokens_key(address))
        load = max(state.load, in_flight)
        return Candidate(address, load, state.kv_usage, state.info.can_encode, busy=busy, queue=in_flight, pending_tokens=pending)


def work_keys(route: Route, mm_hashes: list[MmHash]) -> list[str]:
    """The membership's in-flight keys a routed request counts on until its prefill ends: the
    encoder only when the prefill node may pull embeddings from it (adaptive dispatch weighs the
    encoder's queue by such requests), the prefill node's local encodes when it encodes some."""
    uses_encoder = any(
        h not in route.local_encode and h not in route.images_on_prefill and h not in route.image_to_source for h in mm_hashes
    )
    encoder = [route.encoder] if uses_encoder else []
    local = [local_encode_key(route.prefill)] if route.local_encode else []
    return [*encoder, *local, route.prefill, route.decode]


def pending_tokens_key(address: str) -> str:
    """The membership's in-flight key for the prompt tokens this gateway's requests routed to a
    prefill node have yet to prefill there (adaptive dispatch weighs them)."""
    return f"pending-tokens@{address}"


def local_encode_key(address: str) -> str:
    """The membership's in-flight key for the local encodes this gateway has running on a
    prefill node (adaptive dispatch weighs them, not the node's other calls)."""
    return f"local-encode@{address}"


def _find(candidates: list[Candidate], node_id: str) -> Candidate:
    return next(c for c in candidates if c.node_id == node_id)
