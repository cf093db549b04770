"""What one simulation run counts, and its summary.

tower runs per distinct image   vision-tower passes (encoders and prefill nodes' local encodes)
                                over the distinct images the run's requests brought: 1.0 is
                                exactly-once; a node killed or an embedding evicted costs more
prefill tokens per novel token  prompt tokens computed by prefill nodes over the novel ones: a
                                turn's novel tokens are those past the longest prefix of its
                                blocks any node had computed before it (a prompt's or a reply's
                                blocks), and at least one; 1.0 means every cacheable token came
                                from a cache, wherever it was
hit rates                       prefix: prompt tokens not computed (own cache or pulled from a
                                peer) over prompt tokens; image: image uses needing no tower
                                pass over image uses; compute: both weighted by their modelled
                                cost, the share of the prefill and tower seconds a cold cluster
                                would spend that the caches saved
TTFT                            modelled: arrival to the end of the first successful prefill
                                (which samples the first token), in virtual seconds
decision                        Router.route (or the llm-d scorer) as called, wall clock; and
                                the calling thread's CPU time in it (without the index server's
                                time and without waiting to be scheduled on a busy machine)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from benchmarks.simulate.cluster import ROLES, Costs, SimNode
from services.bench.report import percentile
from shared.types import BlockHash


@dataclass(slots=True)
class Metrics:
    block_size: int
    requests: int = 0
    completed: int = 0
    lost: int = 0
    failovers: int = 0
    migrations: int = 0  # failovers of a request already past its first token (its decode node died)
    no_node_waits: int = 0  # a role had no live node left; the request tried again a second later
    prompt_tokens: int = 0
    computed_tokens: int = 0
    reused_tokens: int = 0
    pulled_tokens: int = 0
    novel_tokens: int = 0
    image_uses: int = 0
    tower_runs: int = 0
    local_encodes: int = 0
    repeat_tower_runs: Counter[str] = field(default_factory=Counter)  # why an image needed the tower again
    busy_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ROLES, 0.0))
    ttft_s: list[float] = field(default_factory=list)
    decision_s: list[float] = field(default_factory=list)
    decision_cpu_s: list[float] = field(default_factory=list)  # this thread's CPU time in the decision
    distinct_images: set[str] = field(default_factory=set)
    _computed_blocks: set[BlockHash] = field(default_factory=set)

    def novel(self, token_ids: list[int], hashes: list[BlockHash]) -> int:
        """Tokens of this prompt past the longest prefix of blocks any node computed before."""
        known = 0
        for block in hashes:
            if block not in self._computed_blocks:
                break
            known += 1
        return max(1, len(token_ids) - known * self.block_size)

    def computed(self, hashes: list[BlockHash]) -> None:
        self._computed_blocks.update(hashes)

    def summary(self, costs: Costs, virtual_s: float, role_to_nodes: dict[str, int], nodes: Iterable[SimNode]) -> dict:
        busiest: dict[str, float] = {}
        for node in nodes:
            busiest[node.role] = max(busiest.get(node.role, 0.0), node.busy_s)
        cold_s = self.prompt_tokens * costs.prefill_s_per_token + self.image_uses * costs.encode_s_per_image
        saved_s = self.reused_tokens * costs.prefill_s_per_token + (self.image_uses - self.tower_runs) * costs.encode_s_per_image
        return {
            "requests": self.requests,
            "completed": self.completed,
            "lost": self.lost,
            "failovers": self.failovers,
            "migrations": self.migrations,
            "no_node_waits": self.no_node_waits,
            "distinct_images": len(self.distinct_images),
            "image_uses": self.image_uses,
            "tower_runs": self.tower_runs,
            "local_encodes": self.local_encodes,
            "repeat_tower_runs": dict(self.repeat_tower_runs),
            "tower_runs_per_distinct_image": _ratio(self.tower_runs, len(self.distinct_images)),
            "prompt_tokens": self.prompt_tokens,
            "computed_tokens": self.computed_tokens,
            "pulled_tokens": self.pulled_tokens,
            "novel_tokens": self.novel_tokens,
            "prefill_tokens_per_novel_token": _ratio(self.computed_tokens, self.novel_tokens),
            "prefix_hit_rate": _ratio(self.reused_tokens, self.prompt_tokens),
            "image_hit_rate": _ratio(self.image_uses - self.tower_runs, self.image_uses),
            "compute_hit_rate": _ratio(saved_s, cold_s),
            "ttft_p50_s": percentile(self.ttft_s, 0.50) if self.ttft_s else None,
            "ttft_p99_s": percentile(self.ttft_s, 0.99) if self.ttft_s else None,
            "decision_p50_ms": percentile(self.decision_s, 0.50) * 1e3 if self.decision_s else None,
            "decision_p99_ms": percentile(self.decision_s, 0.99) * 1e3 if self.decision_s else None,
            "decision_cpu_p50_ms": percentile(self.decision_cpu_s, 0.50) * 1e3 if self.decision_cpu_s else None,
            "decision_cpu_p99_ms": percentile(self.decision_cpu_s, 0.99) * 1e3 if self.decision_cpu_s else None,
            "decisions": len(self.decision_s),
            "virtual_s": virtual_s,
            "utilisation": {role: _ratio(self.busy_s[role], role_to_nodes[role] * virtual_s) for role in ROLES},
            "busiest_node_utilisation": {role: _ratio(busiest.get(role, 0.0), virtual_s) for role in ROLES},
        }


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None
