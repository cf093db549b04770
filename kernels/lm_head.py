"""The LM head on CPU, prepacked for oneDNN in vocabulary chunks: logits, or the argmax alone.

Why chunks: with many rows (a decode step of hundreds of streams) the logits themselves are the
cost. 256 rows of the tiny model's 151,936-token vocabulary are 155 MB of float32 written out and
read back for the argmax, far past the L2 cache. Taking each chunk's maximum while its logits are
still in cache does the same float32 products without that traffic. Few rows cost the same either
way: reading the weight dominates (docs/benchmarks.md, "The LM head in vocabulary chunks").
Why pieces of rows for the argmax: a chunk's products for ARGMAX_PIECE_ROWS rows (16 MB) stay
under the size the process's allocator keeps for reuse (shared/allocator.py); larger ones are
mapped and faulted in again for every chunk (the same section).

Argmax order (per chunk, then across chunks): each block of ARGMAX_BLOCK tokens gets its maximum
(a plain reduction; torch's max with indices over whole rows costs several times more), the row's
first block holding the chunk's maximum is searched for its first such token, and a later chunk
wins only when strictly larger. So ties go to the lowest token id, as torch.argmax. A NaN in the
logits (a broken hidden state) falls back to the full logits, where torch.argmax picks the first
NaN.
"""

from __future__ import annotations

import torch

from kernels.cpu_linear import onednn_linear

VOCAB_CHUNK = 16384
ARGMAX_BLOCK = 1024  # a chunk whose width is not a multiple of it is one block
ARGMAX_PIECE_ROWS = 256


class ChunkedLmHead:
    """Built from ``weight`` [V, H] float32 (not kept); holds one prepacked copy of it, in chunks
    of VOCAB_CHUNK rows (the memory of one more vocabulary matrix). Every row count runs on oneDNN:
    one row is not timed against MKL as PackedLinear does, since a greedy single row takes the
    screen (kernels/screened_argmax.py) and only sampled or logprob rows come here alone."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.vocab_size = weight.shape[0]
        self.chunk_size = VOCAB_CHUNK
        self.block_size = ARGMAX_BLOCK
        self.piece_rows = ARGMAX_PIECE_ROWS
        self.chunks = [
            torch.ops.mkldnn._reorder_linear_weight(weight[start : start + self.chunk_size].detach().contiguous(), None)
            for start in range(0, self.vocab_size, self.chunk_size)
        ]

    @torch.inference_mode()
    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> logits [N, V] float32."""
        return torch.cat([onednn_linear(hidden, chunk, None) for chunk in self.chunks], dim=1)

    @torch.inference_mode()
    def argmax(self, hidden: torch.Tensor) -> list[int]:
        """hidden [N, H] -> the argmax token of each row's logits, without materializing them."""
        tokens: list[int] = []
        for piece in hidden.split(self.piece_rows):
            tokens += self._piece_argmax(piece)
        return tokens

    def _piece_argmax(self, hidden: torch.Tensor) -> list[int]:
        rows = torch.arange(hidden.shape[0])
        best_value = best_id = saw_nan = None
        for index, chunk in enumerate(self.chunks):
            products = onednn_linear(hidden, chunk, None)
            width = products.shape[1]
            num_blocks = width // self.block_size if width % self.block_size == 0 else 1
            blocks = products.view(hidden.shape[0], num_blocks, width // num_blocks)
            value, block = blocks.amax(dim=2).max(dim=1)
            token_id = index * self.chunk_size + block * blocks.shape[2] + blocks[rows, block].argmax(dim=1)
            if best_value is None:
                best_value, best_id, saw_nan = value, token_id, value.isnan()
                continue
            saw_nan |= value.isnan()
            better = value > best_value
            best_value = torch.where(better, value, best_value)
            best_id = torch.where(better, token_id, best_id)
        if bool(saw_nan.any()):
            return self(hidden).argmax(dim=1).tolist()
        return best_id.tolist()
