"""Which of a request's images a prefill node's cached prefix covers: their embeddings are never
read there, so the encoder need not run and no pixels need move (the encoder skip).

An image is covered when the prefix the node will actually reuse reaches its placeholder's end:
  usable = min(prefix_tokens, block_size * ((num_prompt_tokens - 1) // block_size))
the cap is the engine's own (kv_cache_manager.find_cached_prefix: the last prompt token is always
computed, for its logits). A span cut by the prefix is not covered: the tokens after the cut
read the image's embeddings (and Gemma3 attends within an image both ways, so its span is one
unit). The index's view may be stale; a prefix evicted before the request runs makes the prefill
node ask for the embeddings after all, and the pixels are pushed then (the missing-pixels
resend), so a wrong guess costs time, never output.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.types import MmHash, PlaceholderRange


def covered_images(
    images: Sequence[tuple[MmHash, PlaceholderRange]], prefix_tokens: int, num_prompt_tokens: int, block_size: int
) -> frozenset[MmHash]:
    if prefix_tokens <= 0 or num_prompt_tokens <= 0:
        return frozenset()
    usable = min(prefix_tokens, block_size * ((num_prompt_tokens - 1) // block_size))
    return frozenset(h for h, r in images if r.offset + r.length <= usable)
