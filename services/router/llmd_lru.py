"""Per pod, the last keys routed there, in an LRU of bounded capacity: the memory llm-d's
approximate prefix-cache scorer keeps in its gateway instead of asking the model servers what they
hold (policies.LlmdPolicy).

The match is the index's walk done in memory: a map key -> pods whose LRU has it, and the set of
pods still matching, narrowed key by key until it is empty.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


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
