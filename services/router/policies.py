"""Routing policies: each turns a snapshot of one request's candidates and what they hold into a
decision (an encoder, a prefill node, a decode node, and for cache_aware which other node ships
each image it holds), and does nothing else. The router (router.py) takes the snapshot, applies
the decision, and counts the work; scoring.py holds the arithmetic the policies share.

  round_robin   every role in turn; sees every node.
  least_loaded  every role's least loaded node (load, then KV usage), cycling through equals.
  cache_aware   pins a request to the nodes holding its images (exactly-once encoding: the
                encoder holding the most image tokens, whatever its load; then, for the images
                that encoder lacks, the prefill node holding the most while within
                scoring.PIN_LOAD_SLACK of the least loaded), else the highest score (which
                counts a node serving the request's LoRA adapter); decode least loaded, among
                the nodes serving the adapter while within the slack; an image neither pinned
                node holds is shipped by another holder.
  llmd          llm-d's approximate prefix-cache scorer, the baseline the simulator compares
                against: it ignores the index and remembers per pod, in an LRU, the hashes it
                routed there (``observe``), choosing the pod with the longest remembered prefix.

Past router.MAX_SCORED_NODES nodes of a role, a policy whose ``scores_a_sample`` is set sees the
holders of the request's work plus a random draw of the rest (router.py says why).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from services.router.llmd_lru import PodLru
from services.router.scoring import (
    Candidate,
    adapter_holders,
    image_tokens_per_node,
    prefill_tokens_per_node,
    score,
    within_pin_slack,
)
from shared.hashing import digest_hex
from shared.types import BlockHash, MmHash, PlaceholderRange


@dataclass(frozen=True, slots=True)
class RouteSnapshot:
    """What one decision sees. ``mm_holders``: image -> addresses holding (or encoding) it;
    ``prefix_tokens``: address -> leading prompt tokens it holds."""

    turn: int
    images: tuple[tuple[MmHash, PlaceholderRange], ...]
    block_hashes: tuple[BlockHash, ...]
    encoders: tuple[Candidate, ...]
    prefills: tuple[Candidate, ...]
    decodes: tuple[Candidate, ...]
    mm_holders: Mapping[MmHash, Collection[str]] = field(default_factory=dict)
    prefix_tokens: Mapping[str, int] = field(default_factory=dict)

    @property
    def tie_key(self) -> str:
        """Equal nodes are told apart by the request's first image (rendezvous hashing)."""
        return self.images[0][0] if self.images else ""

    @property
    def image_tokens(self) -> dict[MmHash, int]:
        return {h: r.length for h, r in self.images}


@dataclass(frozen=True, slots=True)
class RouteDecision:
    encoder: str
    prefill: str
    decode: str | None  # None: the request has no decode (an embedding)
    # Images neither the encoder nor the prefill node holds that another node ships instead.
    image_to_source: Mapping[MmHash, str] = field(default_factory=dict)


class RoutingPolicy(Protocol):
    name: str
    scores_a_sample: bool

    def select(self, snapshot: RouteSnapshot) -> RouteDecision: ...

    def observe(self, snapshot: RouteSnapshot, decision: RouteDecision) -> None:
        """What the policy learns from its own decision (llmd's LRU); most learn nothing."""


def round_robin_choice(candidates: Sequence[Candidate], turn: int) -> str:
    ordered = sorted(candidates, key=lambda c: c.node_id)
    return ordered[turn % len(ordered)].node_id


def least_loaded_choice(candidates: Sequence[Candidate], turn: int) -> str:
    ordered = sorted(candidates, key=lambda c: c.node_id)
    lowest = min((c.load, c.kv_usage) for c in ordered)
    tied = [c for c in ordered if (c.load, c.kv_usage) == lowest]
    return tied[turn % len(tied)].node_id


def decode_choice(choose: Callable[[Sequence[Candidate], int], str], decodes: Sequence[Candidate], turn: int) -> str | None:
    """The decode node ``choose`` picks; None for a request routed without decode nodes (no
    candidates: an embedding)."""
    return choose(decodes, turn) if decodes else None


def best_scored_choice(candidates: Sequence[Candidate], node_to_cached_tokens: Mapping[str, int], tie_key: str = "") -> str:
    """The highest scoring candidate (scoring.score); ties by rendezvous hashing on ``tie_key``,
    so new items spread evenly over equal nodes and the same item lands on the same node."""
    ordered = sorted(candidates, key=lambda c: c.node_id)
    scores = [score(c, node_to_cached_tokens.get(c.node_id, 0)) for c in ordered]
    tied = [c for c, s in zip(ordered, scores) if s == max(scores)]
    if len(tied) == 1 or not tie_key:
        return tied[0].node_id
    return max(tied, key=lambda c: digest_hex((tie_key, c.node_id))).node_id


class RoundRobinPolicy:
    name = "round_robin"
    scores_a_sample = False

    def select(self, snapshot: RouteSnapshot) -> RouteDecision:
        turn = snapshot.turn
        encoder, prefill = (round_robin_choice(c, turn) for c in (snapshot.encoders, snapshot.prefills))
        return RouteDecision(encoder, prefill, decode_choice(round_robin_choice, snapshot.decodes, turn))

    def observe(self, snapshot: RouteSnapshot, decision: RouteDecision) -> None:
        pass


class LeastLoadedPolicy:
    name = "least_loaded"
    scores_a_sample = True

    def select(self, snapshot: RouteSnapshot) -> RouteDecision:
        turn = snapshot.turn
        encoder, prefill = (least_loaded_choice(c, turn) for c in (snapshot.encoders, snapshot.prefills))
        return RouteDecision(encoder, prefill, decode_choice(least_loaded_choice, snapshot.decodes, turn))

    def observe(self, snapshot: RouteSnapshot, decision: RouteDecision) -> None:
        pass


class CacheAwarePolicy:
    name = "cache_aware"
    scores_a_sample = True

    def select(self, snapshot: RouteSnapshot) -> RouteDecision:
        s, image_tokens = snapshot, snapshot.image_tokens
        encoder_tokens = image_tokens_per_node(s.mm_holders, image_tokens)
        encoder = _pinned(encoder_tokens, s.encoders) or best_scored_choice(s.encoders, encoder_tokens, s.tie_key)
        elsewhere = {h: holders for h, holders in s.mm_holders.items() if encoder not in holders}
        prefill_tokens = prefill_tokens_per_node(s.prefix_tokens, s.mm_holders, s.images)
        prefill = _pinned(image_tokens_per_node(elsewhere, image_tokens), s.prefills, bounded=True) or best_scored_choice(
            s.prefills, prefill_tokens, s.tie_key
        )
        # KV is shipped from prefill: nothing cached counts.
        decode = decode_choice(least_loaded_choice, adapter_holders(s.decodes), s.turn) if s.decodes else None
        lacking = [h for h, _ in s.images if not {encoder, prefill} & set(s.mm_holders.get(h, ()))]
        shipped = _other_holders(lacking, s.mm_holders, [*s.encoders, *s.prefills], {encoder, prefill})
        return RouteDecision(encoder, prefill, decode, shipped)

    def observe(self, snapshot: RouteSnapshot, decision: RouteDecision) -> None:
        pass


def _pinned(held_tokens: Mapping[str, int], candidates: Sequence[Candidate], *, bounded: bool = False) -> str | None:
    """The candidate holding (or encoding) the most of the request's image tokens, if any holds
    one. Such images go there whatever its load: handing over embeddings a node holds costs
    little, and encoding them again elsewhere costs a tower run (exactly-once encoding)."""
    holders = sorted(
        c.node_id for c in candidates if held_tokens.get(c.node_id, 0) > 0 and (not bounded or within_pin_slack(c, candidates))
    )
    return max(holders, key=held_tokens.__getitem__) if holders else None


def _other_holders(
    images: list[MmHash], mm_holders: Mapping[MmHash, Collection[str]], candidates: list[Candidate], chosen: set[str]
) -> dict[MmHash, str]:
    """For each of ``images`` (those the chosen encoder and prefill node lack) that other
    candidates hold or are encoding, the least loaded of them (then the lowest address): a route
    names one encoder and one prefill node, and a session's images can be held by several."""
    others = {c.node_id: c for c in candidates if c.node_id not in chosen}
    out: dict[MmHash, str] = {}
    for mm_hash in dict.fromkeys(images):
        holders = [others[a] for a in mm_holders.get(mm_hash, ()) if a in others]
        if holders:
            out[mm_hash] = min(holders, key=lambda c: (c.load, c.node_id)).node_id
    return out


class LlmdPolicy:
    """llm-d's approximate prefix-cache scorer, per role:
      prefill  the pod whose LRU holds the longest leading run of the prompt's block hashes;
      encoder  the pod whose LRU holds the most of the request's images (an image is its own block);
      decode   the least loaded pod (KV comes from prefill: nothing to match).
    Ties (most often no match at all) go to the least loaded pod, load being this gateway's calls
    in flight there (``Candidate.queue``), then in turn. The chosen pods' LRUs then take the
    request's hashes, whether or not the pods keep them: the view is approximate and never
    corrected. Nothing comes from the index's holder lists, and every pod is scored, as llm-d
    scores every endpoint of its pool."""

    name = "llmd"
    scores_a_sample = False

    def __init__(self, lru_capacity: int) -> None:
        self.blocks = PodLru(lru_capacity)
        self.images = PodLru(lru_capacity)

    def select(self, snapshot: RouteSnapshot) -> RouteDecision:
        s = snapshot
        encoders = {c.node_id: c for c in s.encoders}
        image_counts = self.images.counts({h for h, _ in s.images}, set(encoders))
        best = max(image_counts.values(), default=0)
        encoder = _fewest_calls([c for a, c in encoders.items() if image_counts.get(a, 0) == best], s.turn)
        prefills = {c.node_id: c for c in s.prefills}
        _, longest = self.blocks.longest_prefix(list(s.block_hashes), set(prefills))
        prefill = _fewest_calls([prefills[a] for a in longest] or list(prefills.values()), s.turn)
        return RouteDecision(encoder, prefill, decode_choice(_fewest_calls, s.decodes, s.turn))

    def observe(self, snapshot: RouteSnapshot, decision: RouteDecision) -> None:
        self.images.add(decision.encoder, [h for h, _ in snapshot.images])
        self.blocks.add(decision.prefill, snapshot.block_hashes)


def _fewest_calls(candidates: Sequence[Candidate], turn: int) -> str:
    ordered = sorted(candidates, key=lambda c: c.node_id)
    lowest = min(c.queue for c in ordered)
    tied = [c for c in ordered if c.queue == lowest]
    return tied[turn % len(tied)].node_id


SERVED_POLICIES = ("cache_aware", "round_robin", "least_loaded")  # what a gateway may be told to use


def make_policy(name: str, *, llmd_lru_blocks: int = 0) -> RoutingPolicy:
    """The policy called ``name`` (one of SERVED_POLICIES, or "llmd" with its LRU capacity): the
    one place a policy's name is checked."""
    if name == "cache_aware":
        return CacheAwarePolicy()
    if name == "round_robin":
        return RoundRobinPolicy()
    if name == "least_loaded":
        return LeastLoadedPolicy()
    if name == "llmd" and llmd_lru_blocks > 0:
        return LlmdPolicy(llmd_lru_blocks)
    raise ValueError(f"unknown routing policy {name!r}; choose one of {', '.join(SERVED_POLICIES)}")
