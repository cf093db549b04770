"""When to pull prefix KV pages from a peer instead of recomputing them, as a pure function.

Cost model (seconds), for the n prompt tokens a peer holds beyond this node's own prefix:

    pull(n)      = overhead_s + n * bytes_per_token / bandwidth_bytes_per_s
    recompute(n) = n * prefill_s_per_token

  bytes_per_token   2 (K and V) * layers * kv_heads * head_dim * dtype bytes: what one token's
                    KV weighs on the wire (the small model: 6 KiB)
  bandwidth         data-plane throughput to the peer (ZMQ on loopback measured ~1-2 GB/s)
  overhead_s        the fixed cost of a pull: one gRPC round trip, the peer's page gather on its
                    engine thread, the import on ours
  prefill_s_per_token  this node's recent prefill cost per computed token (an exponential moving
                    average of what it measured, seeded from configuration)

Pull iff pull(n) < recompute(n) and n >= one block. Recomputing is always correct, so any failure
or timeout of a pull falls back to it; the model only decides which is faster. Attention makes
recompute superlinear in the prompt length, so this linear estimate understates recompute for
long prefixes: it errs towards recomputing, never towards a slow pull.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PullCostModel:
    bytes_per_token: int
    bandwidth_bytes_per_s: float = 1.0e9
    overhead_s: float = 0.005

    def pull_s(self, num_tokens: int) -> float:
        return self.overhead_s + num_tokens * self.bytes_per_token / self.bandwidth_bytes_per_s

    def should_pull(self, num_tokens: int, prefill_s_per_token: float, block_size: int) -> bool:
        if num_tokens < block_size:
            return False
        return self.pull_s(num_tokens) < num_tokens * prefill_s_per_token


@dataclass(frozen=True, slots=True)
class KVSource:
    """A peer (prefill or decode node) holding the request's first ``num_tokens`` prompt tokens."""

    grpc_address: str
    num_tokens: int


def blocks_to_pull(num_local_blocks: int, source: KVSource, num_prompt_tokens: int, block_size: int) -> range:
    """Block indices worth asking ``source`` for: past our own prefix, within its prefix, and
    never the block holding the last prompt token (its logits must be computed here anyway)."""
    max_blocks = (num_prompt_tokens - 1) // block_size
    return range(num_local_blocks, min(source.num_tokens // block_size, max_blocks))


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def updated_rate(previous_s_per_token: float, elapsed_s: float, num_tokens: int, *, weight: float = 0.3, min_tokens: int = 32) -> float:
    """Fold one measured prefill into the per-token estimate; tiny prefills are dominated by
    fixed overhead and would make recompute look expensive, so they are ignored."""
    if num_tokens < min_tokens or elapsed_s <= 0:
        return previous_s_per_token
    return (1 - weight) * previous_s_per_token + weight * (elapsed_s / num_tokens)
