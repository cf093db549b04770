"""Routes one request: lookup -> snapshot -> policy -> reserve.

One index lookup; a snapshot of each role's candidates and what they hold; the policy's decision
(policies.py: a pure choice of nodes); then this gateway's count of the work on them.

Candidates are the live nodes of each role from Membership, minus the nodes this request already
saw fail; the lookup adds what each holds (holdings.py). Without an index (or while it is
unreachable) they hold nothing, so cache_aware degrades to tie-breaking and the other policies
still work. Whatever the policy, the route reports the leading prompt tokens each live prefill and
decode node holds, so the caller can pull a prefix instead of recomputing it; adaptive dispatch
(scoring.py) says whether the prefill node encodes the images the encoder lacks. An image this
gateway sent to be encoded, which the index does not list yet, counts as held where it was sent
(pending_encodes.py).

Power of d choices: past MAX_SCORED_NODES nodes of a role, a policy that ``scores_a_sample``
sees the nodes holding the request's work plus MAX_SCORED_NODES others drawn at random (seeded by
the request's turn). The least loaded of d random nodes is nearly as good as the least loaded of
all (Mitzenmacher), and a decision costs the same at 500 nodes as at 20: the draw takes
O(holders + d) nodes, never the role's list (Membership.sample).
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Collection
from dataclasses import dataclass, field, replace

from services.router.coverage import covered_images
from services.router.holdings import holdings
from services.router.membership import Membership
from services.router.pending_encodes import PendingEncodes
from services.router.policies import CacheAwarePolicy, RouteDecision, RouteSnapshot, RoutingPolicy
from services.router.route import NoLiveNodeError, Reservation, Route, work_addresses
from services.router.scoring import (
    Candidate,
    EncodeDispatch,
    encode_on_prefill,
    image_tokens_per_node,
    prefill_tokens_per_node,
)
from shared.hashing import MmSpan
from shared.hashing import block_hashes as compute_block_hashes
from shared.index.reader import IndexReader
from shared.index.types import IndexUnavailableError, NodeState
from shared.types import BlockHash, MmHash, PlaceholderRange

MAX_SCORED_NODES = 16


@dataclass(slots=True)
class Router:
    membership: Membership
    policy: RoutingPolicy = field(default_factory=CacheAwarePolicy)
    index: IndexReader | None = None  # None: no cache lookups (the membership may still use one)
    block_size: int = 16
    encode_dispatch: EncodeDispatch = EncodeDispatch.ADAPTIVE
    _turns: itertools.count = field(default_factory=itertools.count)
    num_index_failures: int = 0
    num_local_encodes: int = 0  # requests whose images the prefill node was chosen to encode
    num_images_covered: int = 0  # images routed to a prefill node whose cached prefix covers them: never encoded
    mean_call_tokens: float = 0.0  # moving average of the image tokens per request sent to encoders
    pending_encodes: PendingEncodes = field(default_factory=PendingEncodes)

    def __post_init__(self) -> None:
        self.encode_dispatch = EncodeDispatch(self.encode_dispatch)  # a name from a flag, checked here

    async def route(
        self,
        token_ids: list[int],
        images: list[tuple[MmHash, PlaceholderRange]],
        cache_salt: str | None = None,
        block_hashes: list[BlockHash] | None = None,
        exclude: frozenset[str] = frozenset(),
        *,
        reserve: bool = False,
        reuse_prefix: bool = True,
        lora_id: str | None = None,
        lora_tower: bool = False,
        decode: bool = True,
    ) -> Route:
        """``block_hashes``: the prompt's (shared.hashing.block_hashes of the same tokens, images and
        salt at this block_size) when the caller has them. ``exclude``: addresses that failed this
        request. ``reserve``: count the route's work on its nodes (``Route.reservation``) in the
        same step as the decision. ``reuse_prefix``: False when the request computes its whole
        prompt (it asks for prompt logprobs): no node's cached prefix is worth anything to it or
        covers its images. ``lora_id``: the request's adapter fingerprint, in its block hashes;
        ``lora_tower``: it changes the vision tower (an encoder serving it is preferred too).
        ``decode``: False for a request that ends at its prefill (an embedding): no decode node
        is chosen (Route.decode None), and a cluster without any serves it.
        Raises NoLiveNodeError when a role has no candidate left."""
        started = time.perf_counter()
        turn = next(self._turns)
        hashes = block_hashes or []
        if self.index is not None and block_hashes is None:
            hashes = compute_block_hashes(
                token_ids, self.block_size, [MmSpan(h, r) for h, r in images], cache_salt=cache_salt, lora_name=lora_id
            )
        mm_holders, prefix_tokens = await self._holdings([h for h, _ in images], hashes)
        if not reuse_prefix:
            prefix_tokens = {}
        # Decide and count the work in one step, so the requests of a burst each see the load and
        # the pending encodes of those routed before them (counted later, all saw one idle encoder).
        # From here on nothing is awaited: on the one event loop the step runs whole, with no lock.
        for mm_hash, address in self.pending_encodes.where(h for h, _ in images if not mm_holders.get(h)).items():
            mm_holders.setdefault(mm_hash, set()).add(address)
        snapshot = self._snapshot(turn, images, hashes, exclude, mm_holders, prefix_tokens, lora_id, lora_tower, decode)
        decision = self.policy.select(snapshot)
        self.policy.observe(snapshot, decision)
        route = self._route(snapshot, decision, len(token_ids), time.perf_counter() - started)
        return self._reserve(route, token_ids, snapshot) if reserve else route

    def _snapshot(
        self,
        turn: int,
        images: list[tuple[MmHash, PlaceholderRange]],
        hashes: list[BlockHash],
        exclude: frozenset[str],
        mm_holders: dict[MmHash, set[str]],
        prefix_tokens: dict[str, int],
        lora_id: str | None = None,
        lora_tower: bool = False,
        decode: bool = True,
    ) -> RouteSnapshot:
        """Each role's candidates (the holders of the request's work among them, when the policy
        scores a sample) and what they hold."""
        image_tokens = {h: r.length for h, r in images}
        prefill_tokens = prefill_tokens_per_node(prefix_tokens, mm_holders, images)
        return RouteSnapshot(
            turn=turn,
            images=tuple(images),
            block_hashes=tuple(hashes),
            encoders=self._candidates(
                "encoder", exclude, turn, image_tokens_per_node(mm_holders, image_tokens), lora_id=lora_id if lora_tower else None
            ),
            prefills=self._candidates("prefill", exclude, turn, prefill_tokens, lora_id=lora_id),
            decodes=self._candidates("decode", exclude, turn, lora_id=lora_id) if decode else (),
            mm_holders=mm_holders,
            prefix_tokens=prefix_tokens,
        )

    def _route(self, snapshot: RouteSnapshot, decision: RouteDecision, num_prompt_tokens: int, decision_s: float) -> Route:
        """The decision with what its nodes hold, the images its prefill node's cached prefix
        covers (no embeddings needed), and the images the prefill node encodes itself."""
        encoder, prefill = decision.encoder, decision.prefill
        covered = covered_images(snapshot.images, snapshot.prefix_tokens.get(prefill, 0), num_prompt_tokens, self.block_size)
        shipped = {h: source for h, source in decision.image_to_source.items() if h not in covered}
        holders = snapshot.mm_holders
        held = frozenset(h for h, _ in snapshot.images if encoder in holders.get(h, ()))
        on_prefill = frozenset(h for h, _ in snapshot.images if prefill in holders.get(h, ()))
        skipped = held | on_prefill | covered | shipped.keys()
        new = [h for h, _ in snapshot.images if h not in skipped]
        local = self._local_encode(new, snapshot.image_tokens, _find(snapshot.encoders, encoder), _find(snapshot.prefills, prefill))
        self.num_images_covered += len(covered)
        prefix = dict(snapshot.prefix_tokens)
        return Route(encoder, prefill, decision.decode, held, prefix, decision_s, local, on_prefill, shipped, images_covered=covered)

    def _reserve(self, route: Route, token_ids: list[int], snapshot: RouteSnapshot) -> Route:
        """The route with its work counted on its nodes (Membership.in_flight) and the images it
        sends to be encoded pending where they go."""
        mm_hashes = [h for h, _ in snapshot.images]
        pending = {route.prefill: max(0, len(token_ids) - route.prefix_tokens_by_node.get(route.prefill, 0))}
        local = [route.prefill] if route.local_encode else []
        needed = route.images_on_encoder | route.images_on_prefill | route.image_to_source.keys() | route.images_covered
        new = [h for h in mm_hashes if h not in needed]
        encode_tokens = {route.encoder: sum(snapshot.image_tokens[h] for h in set(new) if h not in route.local_encode)}
        in_flight = self.membership.in_flight(
            *work_addresses(route, mm_hashes), local_encodes=local, pending_tokens=pending, encode_tokens=encode_tokens
        )
        end_encodes = self.pending_encodes.begin({h: route.prefill if h in route.local_encode else route.encoder for h in new})
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

    async def _holdings(self, mm_hashes: list[MmHash], hashes: list[BlockHash]) -> tuple[dict[MmHash, set[str]], dict[str, int]]:
        """What the index says the live nodes hold (holdings.py); nothing without one."""
        if self.index is None:  # cache lookups off: the membership refreshes itself
            return {}, {}
        try:
            lookup = await self.index.lookup(mm_hashes, hashes)
        except IndexUnavailableError:
            self.num_index_failures += 1
            return {}, {}
        await self.membership.note_version(lookup.membership_version)
        return holdings(lookup, self.membership.resolve(lookup.node_to_epoch), self.block_size)

    def _candidates(
        self, role: str, exclude: frozenset[str], turn: int, holders: Collection[str] = (), *, lora_id: str | None = None
    ) -> tuple[Candidate, ...]:
        """The role's nodes to score: all of them, or past MAX_SCORED_NODES the holders of the
        request's work and a random draw of the others (the module's header says why).
        ``lora_id``: the request's adapter, which a candidate serves or not."""
        nodes = None
        if self.policy.scores_a_sample:
            nodes = self.membership.sample(role, exclude=exclude, holders=holders, k=MAX_SCORED_NODES, rng=random.Random(turn))
        if nodes is None:
            nodes = self.membership.nodes(role, exclude=exclude)
        if not nodes:
            raise NoLiveNodeError(role)
        return tuple(self._candidate(s, lora_id) for s in nodes)

    def _candidate(self, state: NodeState, lora_id: str | None = None) -> Candidate:
        address = state.info.grpc_address
        work = self.membership.work_on(address)
        load = max(state.load, work.num_calls)
        return Candidate(
            address,
            load,
            state.kv_usage,
            state.info.can_encode,
            busy=work.num_local_encodes,
            queue=work.num_calls,
            pending_tokens=work.num_pending_tokens,
            encode_tokens=work.num_encode_tokens,
            has_adapter=lora_id is not None and lora_id in state.adapters,
        )


def _find(candidates: tuple[Candidate, ...], node_id: str) -> Candidate:
    return next(c for c in candidates if c.node_id == node_id)
