"""Node scoring, a pure function of the request's cached work and node load.

For each candidate node n of a role:

    score(n) = cached_tokens(n) - LOAD_WEIGHT * load(n) - KV_WEIGHT * kv_usage(n)

  cached_tokens(n)  work n already holds for this request, in tokens:
                      encoder: sum of the embedding rows of the request's images n holds
                      prefill: block_size * (leading prompt blocks n holds, up to the first miss)
  load(n)           requests queued or running on n (from its heartbeat)
  kv_usage(n)       fraction of n's KV pages in use, 0..1
  LOAD_WEIGHT       tokens of work one queued request is worth (a full prefill of a typical
                    prompt): a node with 2 more queued requests must hold 2*LOAD_WEIGHT more
                    cached tokens to win, so hot caches cannot pile load onto one node
  KV_WEIGHT         penalty for a nearly full KV pool (its new blocks would evict cached ones)

  load(n) is the larger of n's heartbeat load (every gateway's requests, up to ttl/3 old) and the
  requests this gateway has in flight on n (exact, current): between heartbeats a burst would
  otherwise see equal stale loads and pile onto one node.

Policies: cache_aware takes the highest score; least_loaded the lowest load, cycling through
equally loaded nodes with ``turn``; round_robin cycles.
Ties are broken by rendezvous hashing on ``tie_key`` (for example the request's first image), so
new items spread evenly over equal nodes and the same item always lands on the same node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shared.hashing import digest_hex

LOAD_WEIGHT = 256.0
KV_WEIGHT = 128.0
POLICIES = ("cache_aware", "round_robin", "least_loaded")


@dataclass(frozen=True, slots=True)
class Candidate:
    node_id: str
    load: float
    kv_usage: float


def score(candidate: Candidate, cached_tokens: int) -> float:
    return cached_tokens - LOAD_WEIGHT * candidate.load - KV_WEIGHT * candidate.kv_usage


def choose(
    policy: str, candidates: Sequence[Candidate], node_to_cached_tokens: Mapping[str, int], *, turn: int = 0, tie_key: str = ""
) -> str:
    """The chosen node id. ``turn`` is the caller's request counter, used by round_robin."""
    if not candidates:
        raise ValueError("no candidate nodes")
    ordered = sorted(candidates, key=lambda c: c.node_id)
    if policy == "round_robin":
        return ordered[turn % len(ordered)].node_id
    if policy == "least_loaded":
        lowest = min((c.load, c.kv_usage) for c in ordered)
        tied = [c for c in ordered if (c.load, c.kv_usage) == lowest]
        return tied[turn % len(tied)].node_id
    if policy == "cache_aware":
        best = max(score(c, node_to_cached_tokens.get(c.node_id, 0)) for c in ordered)
        tied = [c for c in ordered if score(c, node_to_cached_tokens.get(c.node_id, 0)) == best]
        if len(tied) == 1 or not tie_key:
            return tied[0].node_id
        return max(tied, key=lambda c: digest_hex((tie_key, c.node_id))).node_id
    raise ValueError(f"unknown routing policy {policy!r}; choose one of {', '.join(POLICIES)}")


def prefix_tokens_per_node(node_to_num_prefix_blocks: Mapping[str, int], block_size: int) -> dict[str, int]:
    """Leading prompt blocks each node holds (up to its first missing block, as the index counts
    them), in tokens."""
    return {node_id: num_blocks * block_size for node_id, num_blocks in node_to_num_prefix_blocks.items() if num_blocks > 0}


def image_tokens_per_node(mm_holders: Mapping[str, Mapping[str, object]], image_tokens: Mapping[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for mm_hash, holders in mm_holders.items():
        for node_id in holders:
            out[node_id] = out.get(node_id, 0) + image_tokens.get(mm_hash, 0)
    return out
