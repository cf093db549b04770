"""Greedy argmax over an LM head that reads a bfloat16 copy of the weight, then checks the few
tokens that could win against the float32 weight: the same token as the float32 argmax, at about
half the memory traffic.

Why: reading the float32 LM head is most of a decode step of a few streams (the small built-in
model's is 768 x 151,936, 467 MB); the bfloat16 copy is half the bytes (docs/benchmarks.md,
"Session 2026-11-24 (2)").

The screen (per row h, weight rows W_j, j over the vocabulary):
  1. a_j = bf16 product of bf16(h) and bf16(W_j), summed in float32 and rounded to bfloat16.
  2. Each a_j is within e = C * |h| * max_j |W_j| of the exact h . W_j, where |.| is the 2-norm and
     C = ERROR_SCALE * (3u + H * 2^-24), u = 2^-8 (bfloat16's unit roundoff): rounding h and W_j
     (2u of each product), rounding the sum (u), float32 summation over H terms, and
     Cauchy-Schwarz (sum |h_i W_ji| <= |h| |W_j|). ERROR_SCALE = 2 is a safety factor.
  3. No j with a_j < max_k a_k - 2e can be the argmax: some k is larger for sure.
  4. The others (the candidates, usually a handful) get float32 logits from the float32 weight;
     the first largest wins, as torch.argmax picks the lowest index among equal values.
A row with more than MAX_CANDIDATES candidates (nearly flat logits), or none (a NaN in h), is
computed whole in float32. With ``allowed`` (a structured-output grammar's token mask), tokens
outside it are never candidates: the screen's bound holds for any subset of the vocabulary.

The screen pays where reading the weight dominates: a few rows (decode steps of a few streams).
Its passes over [rows, vocab] grow with the rows, and at many rows it costs more than the float32
product, so ``max_rows``, the most rows it is worth, is timed once when
the head is built (TIMED_ROWS, both ways, each keeping its fastest run); more rows return None
and the caller runs the float32 product.
The float32 logits of step 4 are summed in another order than a full product would, so they may
differ in the last bits, as the oneDNN and MKL paths already do (kernels/cpu_linear.py).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

import torch

from kernels.cpu_linear import onednn_linear

ERROR_SCALE = 2.0
TIMED_ROWS = (1, 2, 4, 8, 16, 32)
NUM_TIMING_RUNS = 3
BF16_UNIT_ROUNDOFF = 2.0**-8
MAX_CANDIDATES = 4096

log = logging.getLogger("tessera.screened_argmax")


@functools.cache
def screening_available() -> bool:
    """Whether this torch build runs oneDNN's bfloat16 products on prepacked weights."""
    try:
        weight, x = torch.randn(8, 4), torch.randn(2, 4)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.bfloat16(), None)
        out = torch.ops.mkldnn._linear_pointwise(x.bfloat16(), packed, None, "none", [], "")
    except (AttributeError, RuntimeError):
        return False
    return bool(torch.allclose(out.float(), x @ weight.t(), atol=0.1, rtol=0.05))


class ScreenedArgmax:
    """argmax_j (h . W_j) for the rows of ``hidden``; ``weight`` is W, [V, H] float32, kept by
    reference (its rows are gathered for the check); holds a bfloat16 prepacked copy of it."""

    def __init__(
        self, weight: torch.Tensor, *, float32_logits: Callable[[torch.Tensor], torch.Tensor] | None = None, max_rows: int | None = None
    ) -> None:
        self.weight = weight
        # The caller's float32 product (a prepacked one), for the fallback rows and the timing.
        self.float32_logits = float32_logits or (lambda hidden: torch.nn.functional.linear(hidden, weight))
        hidden_size = weight.shape[1]
        self.packed_bf16 = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous().bfloat16(), None)
        # C * max_j |W_j|: one bound for every token keeps the screen to a max and a comparison.
        max_row_norm = float(torch.linalg.vector_norm(weight, dim=1).max())
        self.error_per_norm = ERROR_SCALE * (3 * BF16_UNIT_ROUNDOFF + hidden_size * 2.0**-24) * max_row_norm
        self.num_rows_screened = 0
        self.num_rows_unscreened = 0  # rows with too many candidates, or none: computed whole
        self.max_rows = self._time_max_rows() if max_rows is None else max_rows

    def argmax_or_none(self, hidden: torch.Tensor, allowed: torch.Tensor | None = None) -> list[int] | None:
        """The rows' tokens where the screen is worth it (at most ``max_rows`` rows), else None."""
        return self.argmax(hidden, allowed) if hidden.shape[0] <= self.max_rows else None

    @torch.inference_mode()
    def argmax(self, hidden: torch.Tensor, allowed: torch.Tensor | None = None) -> list[int]:
        """hidden [N, H] float32 (and ``allowed`` [N, V] bool, or None for every token) -> N
        token ids."""
        approx = onednn_linear(hidden.bfloat16(), self.packed_bf16, None).float()
        if allowed is not None:
            approx.masked_fill_(~allowed, float("-inf"))
        error = self.error_per_norm * torch.linalg.vector_norm(hidden, dim=1, keepdim=True)
        is_candidate = approx >= approx.amax(dim=1, keepdim=True) - 2 * error
        if allowed is not None:
            is_candidate &= allowed  # a row that allows nothing has no candidate: computed whole
        num_candidates = is_candidate.sum(dim=1).tolist()
        screened = [row for row, n in enumerate(num_candidates) if 0 < n <= MAX_CANDIDATES]
        tokens = [0] * hidden.shape[0]
        if screened:
            self.num_rows_screened += len(screened)
            # One gather for every row: the union of their candidates, each row then masked to its own.
            ids = is_candidate[screened].any(dim=0).nonzero().squeeze(1)
            exact = hidden[screened] @ self.weight.index_select(0, ids).t()
            exact.masked_fill_(~is_candidate[screened][:, ids], float("-inf"))
            for row, best in zip(screened, exact.argmax(dim=1).tolist()):
                tokens[row] = int(ids[best])
        for row in set(range(hidden.shape[0])).difference(screened):  # NaN in h, or flat logits
            self.num_rows_unscreened += 1
            logits = self.float32_logits(hidden[row : row + 1])
            if allowed is not None:
                logits = logits.masked_fill(~allowed[row], float("-inf"))
            tokens[row] = int(logits.argmax())
        return tokens

    @torch.inference_mode()
    def _time_max_rows(self) -> int:
        """The most rows (of TIMED_ROWS, up to the first that lost) at which the screen beat the
        float32 product, timed in turns on random rows; 0 if it never did."""
        generator = torch.Generator().manual_seed(0)
        best = 0
        for num_rows in TIMED_ROWS:
            hidden = torch.randn(num_rows, self.weight.shape[1], generator=generator)
            screened, full = float("inf"), float("inf")
            for _ in range(NUM_TIMING_RUNS):
                started = time.perf_counter()
                self.argmax(hidden)
                screened = min(screened, time.perf_counter() - started)
                started = time.perf_counter()
                self.float32_logits(hidden).argmax(dim=1)
                full = min(full, time.perf_counter() - started)
            if screened >= full:
                break
            best = num_rows
        self.num_rows_screened = self.num_rows_unscreened = 0
        log.info("screened greedy head: up to %d rows per step", best)
        return best
