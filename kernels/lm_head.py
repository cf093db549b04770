"""The LM head on CPU, prepacked for oneDNN in vocabulary chunks: logits, or the argmax alone.

Why chunks: with many rows (a decode step of hundreds of streams) the logits themselves are the
cost. 256 rows of the tiny model's 151,936-token vocabulary are 155 MB of float32 written out and
read back for the argmax, far past the L3 cache. Taking each chunk's maximum while its logits are
still in cache does the same float32 products without that traffic. Few rows cost the same either
way: reading the weight dominates (docs/benchmarks.md, "Session 2026-11-24 (2)").

Argmax order: chunks are visited in vocabulary order and a later chunk wins only when strictly
larger, so ties go to the lowest token id, as torch.argmax. A NaN in the logits (a broken hidden
state) falls back to the full logits, where torch.argmax picks the first NaN.
"""

from __future__ import annotations

import torch

from kernels.cpu_linear import onednn_linear

VOCAB_CHUNK = 8192


class ChunkedLmHead:
    """Built from ``weight`` [V, H] float32 (not kept); holds one prepacked copy of it, in chunks
    of VOCAB_CHUNK rows (the memory of one more vocabulary matrix). Every row count runs on oneDNN:
    one row is not timed against MKL as PackedLinear does, since a greedy single row takes the
    screen (kernels/screened_argmax.py) and only sampled or logprob rows come here alone."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.vocab_size = weight.shape[0]
        self.chunks = [
            torch.ops.mkldnn._reorder_linear_weight(weight[start : start + VOCAB_CHUNK].detach().contiguous(), None)
            for start in range(0, self.vocab_size, VOCAB_CHUNK)
        ]

    @torch.inference_mode()
    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> logits [N, V] float32."""
        return torch.cat([onednn_linear(hidden, chunk, None) for chunk in self.chunks], dim=1)

    @torch.inference_mode()
    def argmax(self, hidden: torch.Tensor) -> list[int]:
        """hidden [N, H] -> the argmax token of each row's logits, without materializing them."""
        best_value, best_id = onednn_linear(hidden, self.chunks[0], None).max(dim=1)
        saw_nan = best_value.isnan()
        for index, chunk in enumerate(self.chunks[1:], start=1):
            value, token_id = onednn_linear(hidden, chunk, None).max(dim=1)
            saw_nan |= value.isnan()
            better = value > best_value
            best_value = torch.where(better, value, best_value)
            best_id = torch.where(better, token_id + index * VOCAB_CHUNK, best_id)
        if bool(saw_nan.any()):
            return self(hidden).argmax(dim=1).tolist()
        return best_id.tolist()
