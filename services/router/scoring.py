"""Node scoring, a pure function of the request's cached work and node load.

For each candidate node n of a role:

    score(n) = cached_tokens(n) + ADAPTER_WEIGHT * has_adapter(n)
               - LOAD_WEIGHT * load(n) - KV_WEIGHT * kv_usage(n) - encode_tokens(n)

  cached_tokens(n)  work n already holds for this request, in tokens:
                      encoder: sum of the embedding rows of the request's images n holds
                      prefill: block_size * (leading prompt blocks n holds, up to the first miss),
                               plus the embedding rows of each image whose encode n saves: one
                               that prefix covers (never encoded: coverage.py) or one whose
                               embeddings n holds
  load(n)           requests queued or running on n (from its heartbeat)
  encode_tokens(n)  an encoder's image tokens this gateway sent it to encode, not yet encoded:
                    a node already encoding big images is charged for them in the tokens
                    cached_tokens counts in, not only as one request each
  kv_usage(n)       fraction of n's KV pages in use, 0..1
  has_adapter(n)    1 when the request names a LoRA adapter n's record says it serves
                    (NodeState.adapters), else 0
  LOAD_WEIGHT       tokens of work one queued request is worth (a full prefill of a typical
                    prompt): a node with 2 more queued requests must hold 2*LOAD_WEIGHT more
                    cached tokens to win, so hot caches cannot pile load onto one node
  KV_WEIGHT         penalty for a nearly full KV pool (its new blocks would evict cached ones)
  ADAPTER_WEIGHT    LOAD_WEIGHT * PIN_LOAD_SLACK: a node lacking the adapter must first be
                    given it (the gateway's load call, the node's file read, a slot and memory
                    from then on), so a holder wins until it has PIN_LOAD_SLACK more queued
                    requests, the same bound as an image pin's; past it the adapter spreads

  load(n) is the larger of n's heartbeat load (every gateway's requests, up to ttl/3 old) and the
  requests this gateway has in flight on n (exact, current): between heartbeats a burst would
  otherwise see equal stale loads and pile onto one node.

Adaptive dispatch: where the images the chosen encoder e lacks are encoded, when the chosen
prefill node p has its own vision tower. With s seconds per image token and T the request's
image tokens e lacks:

    cost_on_encoder = queue(e) * mean_call_tokens * s + T * s  e's queue ahead, then the encode
    cost_on_prefill = T * s * (1 + busy(p))                     p's cores are shared with the
                      + R * pending(p) * s                      busy(p) requests computing there,
                                                                and p owes the prefills in flight
    encode on p  iff  cost_on_prefill < cost_on_encoder
                 <=>  T * busy(p) + R * pending(p) < queue(e) * mean_call_tokens

  queue(e)          the calls this gateway has in flight that use e (exact and current; e's
                    heartbeat load is up to ttl/3 old, and a stale one would send images to
                    prefill nodes while e sits idle), counted from the routing decision itself,
                    so the requests of a burst each see the ones routed before them. With
                    several gateways each sees its share.

  busy(p)           this gateway's local encodes in flight on p (exact and current, like
                    queue(e): p's heartbeat engine queue is up to ttl/3 old, and a stale one
                    from a finished warm-up kept a whole burst of images off an idle p); not
                    load(p), which counts every call on p, most of them waiting on encoders

  pending(p)        prompt tokens p has yet to prefill for this gateway's requests routed to it
                    (each request's prompt less the prefix p holds), also counted from the
                    decision. Every one of them lands on p's cores whichever way its images go,
                    so an image encoded on p waits behind them. Without this term a burst of four
                    cold images on a 1/1/1 stack went two to p, which then had two encodes and
                    four prefills to run while e idled

  R                 PREFILL_TO_ENCODE_COST: what a prompt token costs to prefill, in image tokens
                    encoded, from the prefill and tower times of the small model on one core
                    (docs/benchmarks.md, "Measurements behind code comments")

  mean_call_tokens  the mean image tokens of the requests routed to encoders (the router's moving
                    average): what one call queued on e is assumed to cost
  s cancels. An idle encoder (queue 0) always wins, so an unloaded cluster keeps the
  encode/prefill split; the shipping of embeddings, which only favours p, is left out, so the
  rule leans towards the encoder tier.

The policies that use these (cache_aware's score and pins) are in policies.py.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from shared.types import PlaceholderRange

LOAD_WEIGHT = 256.0
KV_WEIGHT = 128.0


class EncodeDispatch(StrEnum):
    """Where images are encoded. ``EncodeDispatch(name)`` is the one check of a name."""

    ADAPTIVE = "adaptive"  # by the rule above
    ENCODER = "encoder"  # always on the encoder tier
    PREFILL = "prefill"  # on the prefill node whenever it can encode (tests, encoder-light deployments)

    @classmethod
    def _missing_(cls, value: object) -> EncodeDispatch:
        raise ValueError(f"unknown encode dispatch {value!r}; choose one of {', '.join(d.value for d in cls)}")


ENCODE_DISPATCHES = tuple(d.value for d in EncodeDispatch)
PREFILL_TO_ENCODE_COST = 0.4
# Bounded pinning to a prefill node (router.py's exactly-once pins): a prefill node holding the
# request's images pins it only while it has at most PIN_LOAD_SLACK more requests than the least
# loaded prefill candidate. Past that, waiting behind its queue costs more than one more tower
# run: the image is encoded again on the encoder tier, which can then hand it to any prefill
# node, so a hot image costs at most one extra run instead of a queue on one node.
PIN_LOAD_SLACK = 4.0
ADAPTER_WEIGHT = LOAD_WEIGHT * PIN_LOAD_SLACK


@dataclass(frozen=True, slots=True)
class Candidate:
    node_id: str
    load: float
    kv_usage: float
    can_encode: bool = False  # a prefill node with its own vision tower
    busy: float = 0.0  # a prefill node's busy(p) of the adaptive dispatch rule
    queue: float = 0.0  # an encoder's queue(e) of the adaptive dispatch rule
    pending_tokens: float = 0.0  # a prefill node's pending(p) of the adaptive dispatch rule
    encode_tokens: float = 0.0  # an encoder's image tokens this gateway sent it, not yet encoded
    has_adapter: bool = False  # it serves the request's LoRA adapter (the request names one)


def within_pin_slack(holder: Candidate, candidates: Sequence[Candidate]) -> bool:
    return holder.load <= min(c.load for c in candidates) + PIN_LOAD_SLACK


def score(candidate: Candidate, cached_tokens: int) -> float:
    adapter = ADAPTER_WEIGHT if candidate.has_adapter else 0.0
    return cached_tokens + adapter - LOAD_WEIGHT * candidate.load - KV_WEIGHT * candidate.kv_usage - candidate.encode_tokens


def adapter_holders(candidates: Sequence[Candidate]) -> Sequence[Candidate]:
    """The candidates serving the request's adapter while within PIN_LOAD_SLACK of the least
    loaded (ADAPTER_WEIGHT's bound, for a role chosen by load alone: decode); else all."""
    holders = [c for c in candidates if c.has_adapter and within_pin_slack(c, candidates)]
    return holders or candidates


def default_encode_dispatch(cores_shared: bool) -> EncodeDispatch:
    """The dispatch a launcher gives a stack whose operator chose none. Where the encoder and
    prefill nodes run on the same cores (shared/colocation/cpu_budget.py's cores_shared), "encoder": a local
    encode there runs on the very cores the encoder's queue waits for, so it saves nothing, and
    the request it serves overtakes the ones queued before it, which spreads TTFT out; first come,
    first served keeps the tail short at the same throughput (docs/benchmarks.md, "First come,
    first served where the roles share cores"). Elsewhere "adaptive": the prefill node's tower
    has cores of its own."""
    return EncodeDispatch.ENCODER if cores_shared else EncodeDispatch.ADAPTIVE


def encode_on_prefill(
    dispatch: EncodeDispatch, num_new_tokens: int, encoder: Candidate, prefill: Candidate, mean_call_tokens: float
) -> bool:
    """Whether ``prefill`` encodes the request's ``num_new_tokens`` image tokens that ``encoder``
    lacks, by the adaptive dispatch rule in this module's header."""
    if num_new_tokens <= 0 or not prefill.can_encode or dispatch == EncodeDispatch.ENCODER:
        return False
    if dispatch == EncodeDispatch.PREFILL:
        return True
    prefill_cost = num_new_tokens * prefill.busy + PREFILL_TO_ENCODE_COST * prefill.pending_tokens
    return prefill_cost < encoder.queue * mean_call_tokens


def prefix_tokens_per_node(node_to_num_prefix_blocks: Mapping[str, int], block_size: int) -> dict[str, int]:
    """Leading prompt blocks each node holds (up to its first missing block, as the index counts
    them), in tokens."""
    return {node_id: num_blocks * block_size for node_id, num_blocks in node_to_num_prefix_blocks.items() if num_blocks > 0}


def prefill_tokens_per_node(
    prefix_tokens: Mapping[str, int], mm_holders: Mapping[str, Collection[str]], images: Sequence[tuple[str, PlaceholderRange]]
) -> dict[str, int]:
    """cached_tokens of each prefill node: its leading prompt tokens, plus the rows of each image
    whose tower run it saves: one its prefix covers (never encoded; coverage.py), or one whose
    embeddings it holds."""
    out = dict(prefix_tokens)
    for mm_hash, placeholder in images:
        end = placeholder.offset + placeholder.length
        savers = {n for n, prefix in prefix_tokens.items() if end <= prefix} | set(mm_holders.get(mm_hash, ()))
        for node_id in savers:
            out[node_id] = out.get(node_id, 0) + placeholder.length
    return out


def image_tokens_per_node(mm_holders: Mapping[str, Collection[str]], image_tokens: Mapping[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for mm_hash, holders in mm_holders.items():
        for node_id in holders:
            out[node_id] = out.get(node_id, 0) + image_tokens.get(mm_hash, 0)
    return out
