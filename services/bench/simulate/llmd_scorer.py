"""An llm-d-style routing baseline: a per-pod LRU prefix-cache scorer in the gateway.

llm-d's inference scheduler (its "prefix-cache scorer" in approximate mode) does not ask the model
servers what they hold: the gateway remembers, per pod, the block hashes of the prompts it routed
there, in an LRU of bounded capacity, and scores each pod by the prompt's longest prefix found in
that pod's LRU. This class does the same per role, with Tessera's block hashes:

  prefill  the pod whose LRU holds the longest leading run of the prompt's block hashes;
  encoder  the pod whose LRU holds the most of the request's images (an image is its own block);
  decode   the least loaded pod (KV comes from prefill: nothing to match).

Ties (equal match, most often no match at all) go to the least loaded pod, load being this
gateway's requests in flight there (Membership.in_flight, as for Tessera's policies), then to the
next pod in turn. The chosen pod's LRU then takes the request's hashes, whether or not the pod will
keep them: the view is approximate and never corrected. Nothing comes from the index's holder
lists; the index only says which pods are live (Membership). Every pod of a role is scored, as
llm-d scores every endpoint of its pool.

The match is the index's walk done in memory: a map block hash -> pods whose LRU has it, and the
set of pods still matching, narrowed block by block until it is empty.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Iterable

from services.router.membership import Membership
from services.router.router import NoLiveNodeError, Reservation, Route, work_keys
from shared.types import BlockHash, MmHash, PlaceholderRange


class PodLru:
    """Per pod, the last ``capacity`` keys routed there, and key -> pods holding it."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("the per-pod LRU needs a capacity of at least 1")
        self.capacity = capacity
        self._pod_to_keys: dict[str, OrderedDict[str, None]] = {}
        self._key_to_pods: dict[str, set[str]] = {}

    def add(self, pod: str, keys: Iterable[str]) -> None:
        held = self._pod_to_keys.setdefault(pod, OrderedDict())
        for key in keys:
            if key in held:
                held.move_to_end(key)
                continue
            held[key] = None
            self._key_to_pods.setdefault(key, set()).add(pod)
        while len(held) > self.capacity:
            old, _ = held.popitem(last=False)
            pods = self._key_to_pods[old]
            pods.discard(pod)
            if not pods:
                del self._key_to_pods[old]

    def holders(self, key: str) -> set[str]:
        return self._key_to_pods.get(key, set())

    def longest_prefix(self, keys: list[str], pods: set[str]) -> tuple[int, set[str]]:
        """The most leading ``keys`` any of ``pods`` holds, and the pods holding that many."""
        matching, depth = pods, 0
        for key in keys:
            still = matching & self.holders(key)
            if not still:
                break
            matching, depth = still, depth + 1
        return depth, (matching if depth else set())

    def counts(self, keys: Iterable[str], pods: set[str]) -> dict[str, int]:
        """Per pod, how many of ``keys`` it holds (pods holding none absent)."""
        out: dict[str, int] = {}
        for key in keys:
            for pod in self.holders(key) & pods:
                out[pod] = out.get(pod, 0) + 1
        return out


class LlmdScorer:
    """Routes like Router.route (the same signature and Route), by the rule in the module header."""

    def __init__(self, membership: Membership, *, lru_capacity: int) -> None:
        self.membership = membership
        self.blocks = PodLru(lru_capacity)
        self.images = PodLru(lru_capacity)
        self._turns = itertools.count()

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
        started = time.perf_counter()
        turn = next(self._turns)
        mm_hashes = [h for h, _ in images]
        encoders = self._pods("encoder", exclude)
        image_counts = self.images.counts(set(mm_hashes), encoders)
        best = max(image_counts.values(), default=0)
        encoder = self._least_loaded([p for p in encoders if image_counts.get(p, 0) == best], turn)
        prefills = self._pods("prefill", exclude)
        _, longest = self.blocks.longest_prefix(list(block_hashes or []), prefills)
        prefill = self._least_loaded(longest or prefills, turn)
        decode = self._least_loaded(self._pods("decode", exclude), turn)
        self.images.add(encoder, mm_hashes)
        self.blocks.add(prefill, block_hashes or [])
        route = Route(encoder, prefill, decode, frozenset(), {}, time.perf_counter() - started)
        if not reserve:
            return route
        in_flight = self.membership.in_flight(*work_keys(route, mm_hashes))
        return Route(encoder, prefill, decode, frozenset(), {}, route.decision_s, reservation=Reservation(in_flight, lambda: None))

    def _pods(self, role: str, exclude: frozenset[str]) -> set[str]:
        pods = {s.info.grpc_address for s in self.membership.nodes(role, exclude=exclude)}
        if not pods:
            raise NoLiveNodeError(role)
        return pods

    def _least_loaded(self, pods: Iterable[str], turn: int) -> str:
        ordered = sorted(pods)
        loads = [self.membership.num_in_flight(p) for p in ordered]
        lowest = min(loads)
        tied = [p for p, load in zip(ordered, loads) if load == lowest]
        return tied[turn % len(tied)]
