"""Greedy argmax over an LM head that reads a bfloat16 copy of the weight, then checks the few
tokens that could win against the float32 weight: the same token as the float32 argmax, at about
half the memory traffic and, where the CPU multiplies bfloat16 natively, half the arithmetic.

Why: reading the float32 LM head is most of a decode step of a few streams (the small built-in
model's is 768 x 151,936, 467 MB), and its products are most of a step of many streams; the
bfloat16 copy halves both (docs/benchmarks.md, "The bfloat16 screen").

The screen (per row h, weight rows W_j, j over the vocabulary; b(x) is x rounded to bfloat16):
  1. a_j = b(s_j), where s_j is the float32 sum of the products of b(h) and b(W_j) (each product
     exact in float32).
  2. Two bounds on how far a_j is from the exact h . W_j:
     - the inputs: |s_j - h . W_j| <= d = |h - b(h)| max_k |W_k| + |b(h)| max_k |W_k - b(W_k)|
       + H 2^-24 |b(h)| max_k |b(W_k)| + H 2^-126, where |.| is the 2-norm: the rounding of h
       and of W_j (Cauchy-Schwarz, with the rounding errors measured, not bounded), float32
       summation over H terms, and denormals flushed to zero;
     - the output: |a_j - s_j| <= u' |a_j|, u' = u / (1 - u), u = 2^-8 (bfloat16's unit roundoff).
  3. With M = max_k a_k, no j with a_j < M - ERROR_SCALE * (2d + 2u' |M|) can be the argmax:
     the token that gave M is larger for sure. ERROR_SCALE = 2 is a safety factor (the bound
     holds without it when M - 2d - 2u'|M| >= -|M|; with it, always).
  4. The others (the candidates, usually a handful) get float32 logits from the float32 weight;
     the first largest wins, as torch.argmax picks the lowest index among equal values.
A row with more than MAX_CANDIDATES candidates (nearly flat logits), or none (a NaN in h), is
computed whole in float32.

Sampled rows (``race``, kernels/race.py) race instead: the token is the argmax of the float32
scores l_j / T + g_j, where |g_j| <= G (MAX_ABS_GUMBEL) or g_j = -inf (never a winner). Step 1
adds the noise to a_j / T, giving s'_j, and M is the largest s'. A token can come near the top
only if its logit is near it too: s'_j >= M - X implies |a_j| / T <= B = |M| + G + X. Such a token's score is off by at
most e = d / T + c B + 2^-22 G, c = u' + 2^-22: the approximation, and float32 rounding of s'_j and
of step 4's score. A token below M - X with a larger |a_j| has a_j < 0, and with its error it stays
below the top. So step 3 keeps s'_j >= M - X with X = ERROR_SCALE * 2e, which, B holding X, solves
to X = 2 ERROR_SCALE (d / T + c (|M| + G) + 2^-22 G) / (1 - 2 ERROR_SCALE c). No pass over the
products or the noise finds a bound. Step 4 scores its candidates with the same float32 expression
as every other path. With ``allowed`` (a structured-output grammar's token mask), tokens
outside it are never candidates: the screen's bound holds for any subset of the vocabulary.

In vocabulary chunks: step 1 runs a chunk at a time and takes the maximum of each block of
SUB_BLOCK tokens while the chunk's products are still in cache (at hundreds of rows the products
themselves are larger than the cache); step 3 then reads only the blocks whose maximum reaches the
row's threshold, usually one per row. At a thousand rows (a decode step of a small model) the
screen writes hundreds of megabytes of products, so every further pass over them costs as much as
the products (docs/benchmarks.md, "The bfloat16 screen").

Whether it pays is timed once, after the head is built (``calibrate``, at TIMED_ROWS against the
caller's float32 path): ``max_rows`` is the most rows at which it won, None when it won at every
count timed (then it is used at every width), 0 when it never did (a CPU without bfloat16
arithmetic). The widths go up to 256 rows, the decode batch's default bound: the float32 head's
own argmax costs less per row in wide batches (kernels/lm_head.py), so a win at 64 rows does not
imply one at 256 (docs/benchmarks.md, "The bfloat16 screen"). A wide width is timed
in fewer runs (about TIMED_ROWS_PER_ROUND rows per round), so start-up stays short. Raced rows
use the same ``max_rows``, timed on greedy rows: the products are the cost either way, and both
paths add the same noise.
The float32 logits of step 4 are summed in another order than a full product would, so they may
differ in the last bits, as the oneDNN and MKL paths already do (kernels/cpu_linear.py).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

import torch

from kernels.cpu_linear import MAX_PIECE_ROWS, onednn_linear
from kernels.race import MAX_ABS_GUMBEL, Race, race_scores

ERROR_SCALE = 2.0
TIMED_ROWS = (1, 4, 16, 64, 256)
NUM_TIMING_RUNS = 5
TIMED_ROWS_PER_ROUND = 320
NUM_TIMING_ROUNDS = 2
BF16_UNIT_ROUNDOFF = 2.0**-8
OUTPUT_ROUNDOFF = BF16_UNIT_ROUNDOFF / (1 - BF16_UNIT_ROUNDOFF)  # step 2's u'
RACE_ROUNDING = 2.0**-22  # a race's float32 rounding, relative (the header's 2^-22)
MAX_CANDIDATES = 4096
# Tokens per chunk of step 1: a chunk's products for 64 rows (2 MB of bfloat16) stay in a core's
# L2 cache, and few chunks keep a step of one row from paying per-chunk overhead.
SCREEN_CHUNK = 16384
EXACT_PIECE = 16384  # candidates whose weight rows are gathered at once (bounds that copy)
# Tokens per block whose maximum step 1 keeps: step 3 then reads only the blocks that reach a
# row's threshold (usually one) instead of whole chunks. A chunk whose width is not a multiple of
# it (the vocabulary's last) is one block. Much smaller blocks make the maxima cost more than they
# save: a reduction over short runs is slower per value than over whole rows.
SUB_BLOCK = 1024


def _num_blocks(width: int) -> int:
    return width // SUB_BLOCK if width % SUB_BLOCK == 0 else 1


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


def _max_row_norms(weight: torch.Tensor, weight_bf16: torch.Tensor) -> tuple[float, float, float]:
    """Step 2's maxima over the vocabulary: max_k |W_k|, max_k |W_k - b(W_k)| and max_k |b(W_k)|,
    a chunk at a time (no float32 copy of the whole matrix at start-up), in float64."""
    maxima = [0.0, 0.0, 0.0]
    for rows, rows_bf16 in zip(weight.split(SCREEN_CHUNK), weight_bf16.split(SCREEN_CHUNK)):
        exact, rounded = rows.double(), rows_bf16.double()
        for index, matrix in enumerate((exact, exact - rounded, rounded)):
            maxima[index] = max(maxima[index], float(torch.linalg.vector_norm(matrix, dim=1).max()))
    return maxima[0], maxima[1], maxima[2]


class ScreenedArgmax:
    """argmax_j (h . W_j) for the rows of ``hidden``; ``weight`` is W, [V, H] float32, kept by
    reference (its rows are gathered for the check); holds a bfloat16 prepacked copy of it, in
    chunks of ``vocab_chunk`` tokens."""

    def __init__(
        self,
        weight: torch.Tensor,
        *,
        float32_logits: Callable[[torch.Tensor], torch.Tensor] | None = None,
        max_rows: int | None = None,
        vocab_chunk: int = SCREEN_CHUNK,
    ) -> None:
        self.weight = weight
        # The caller's float32 product (a prepacked one), for the rows computed whole.
        self.float32_logits = float32_logits or (lambda hidden: torch.nn.functional.linear(hidden, weight))
        self.vocab_chunk = vocab_chunk
        bf16 = weight.detach().contiguous().bfloat16()
        self.packed_chunks = [torch.ops.mkldnn._reorder_linear_weight(rows.contiguous(), None) for rows in bf16.split(vocab_chunk)]
        self.max_blocks_per_chunk = max(_num_blocks(rows.shape[0]) for rows in bf16.split(vocab_chunk))
        # One bound for every token keeps the screen to a max and a comparison.
        self.max_weight_norm, self.max_rounding_norm, self.max_bf16_weight_norm = _max_row_norms(weight, bf16)
        self.num_rows_screened = 0
        self.num_rows_unscreened = 0  # rows with too many candidates, or none: computed whole
        self.max_rows = max_rows  # the most rows worth screening; None: every width (see calibrate)

    def argmax_or_none(self, hidden: torch.Tensor, allowed: torch.Tensor | None = None, race: Race | None = None) -> list[int] | None:
        """The rows' tokens where the screen is worth it (at most ``max_rows`` rows), else None."""
        if self.max_rows is not None and hidden.shape[0] > self.max_rows:
            return None
        return self.argmax(hidden, allowed, race)

    @torch.inference_mode()
    def argmax(self, hidden: torch.Tensor, allowed: torch.Tensor | None = None, race: Race | None = None) -> list[int]:
        """hidden [N, H] float32 (``allowed`` [N, V] bool, or None for every token; ``race``, the
        rows' sampling noise, or None for the argmax of the logits) -> N token ids."""
        hidden_bf16 = hidden.bfloat16()
        pieces, block_maxima = self._approximate(hidden_bf16, allowed, race)
        row_max = block_maxima.amax(dim=(1, 2)).float()
        threshold = row_max - ERROR_SCALE * self._margin(hidden, hidden_bf16, row_max, race)
        # A NaN in h, or a row that allows nothing, has no finite threshold: computed whole.
        reaches = (block_maxima.float() >= threshold[:, None, None]) & threshold.isfinite()[:, None, None]
        rows, token_ids = self._candidates(pieces, reaches, threshold, race)
        num_candidates = torch.bincount(rows, minlength=hidden.shape[0])
        screened = (num_candidates > 0) & (num_candidates <= MAX_CANDIDATES)
        keep = screened[rows]
        rows, token_ids = rows[keep], token_ids[keep]
        # Step 4: each candidate's float32 logit (or score); per row the largest, then the lowest id among equals.
        exact = torch.cat(
            [
                (hidden.index_select(0, piece_rows) * self.weight.index_select(0, piece_ids)).sum(dim=1)
                for piece_rows, piece_ids in zip(rows.split(EXACT_PIECE), token_ids.split(EXACT_PIECE))
            ]
            or [torch.empty(0)]
        )
        if race is not None:
            exact = race_scores(exact, race.temperatures[rows, 0], race.gumbel[rows, token_ids])
        best = torch.full((hidden.shape[0],), float("-inf")).scatter_reduce_(0, rows, exact, "amax")
        wins = exact == best[rows]
        tokens = torch.full((hidden.shape[0],), self.weight.shape[0], dtype=torch.long)
        tokens = tokens.scatter_reduce_(0, rows[wins], token_ids[wins], "amin").tolist()
        unscreened = (~screened).nonzero().squeeze(1).tolist()
        self.num_rows_screened += hidden.shape[0] - len(unscreened)
        for row in unscreened:
            self.num_rows_unscreened += 1
            logits = self.float32_logits(hidden[row : row + 1])
            if race is not None:
                logits = race_scores(logits, race.temperatures[row : row + 1], race.gumbel[row : row + 1])
            if allowed is not None:
                logits = logits.masked_fill(~allowed[row], float("-inf"))
            tokens[row] = int(logits.argmax())
        return tokens

    def _margin(self, hidden: torch.Tensor, hidden_bf16: torch.Tensor, row_max: torch.Tensor, race: Race | None) -> torch.Tensor:
        """Step 3's distance below each row's largest approximate score, over ERROR_SCALE."""
        error = self.input_error(hidden, hidden_bf16)
        if race is None:
            return 2 * error + 2 * OUTPUT_ROUNDOFF * row_max.abs()
        spread = OUTPUT_ROUNDOFF + RACE_ROUNDING
        near_top = error / race.temperatures[:, 0] + spread * (row_max.abs() + MAX_ABS_GUMBEL) + RACE_ROUNDING * MAX_ABS_GUMBEL
        return 2 * near_top / (1 - 2 * ERROR_SCALE * spread)

    def input_error(self, hidden: torch.Tensor, hidden_bf16: torch.Tensor) -> torch.Tensor:
        """Step 2's d for each row: [N] float32 (norms in float64, whose squares do not underflow)."""
        exact = hidden.double()
        rounding = torch.linalg.vector_norm(exact - hidden_bf16.double(), dim=1)
        norm_bf16 = torch.linalg.vector_norm(hidden_bf16.double(), dim=1)
        num_terms = hidden.shape[1]
        error = (
            rounding * self.max_weight_norm
            + norm_bf16 * (self.max_rounding_norm + num_terms * 2.0**-24 * self.max_bf16_weight_norm)
            + num_terms * 2.0**-126
        )
        return error.float()

    def _approximate(
        self, hidden_bf16: torch.Tensor, allowed: torch.Tensor | None, race: Race | None
    ) -> tuple[list[list[torch.Tensor]], torch.Tensor]:
        """Step 1, a chunk at a time and at most MAX_PIECE_ROWS rows at a time: each piece's
        bfloat16 products [rows, chunk] (kept for the candidates, never concatenated: at a
        thousand rows that copy cost as much as the products) and each row's maximum in every
        block of SUB_BLOCK tokens, [N, num_chunks, blocks per chunk] (bfloat16; float32 scores
        when racing)."""
        num_rows, num_chunks = hidden_bf16.shape[0], len(self.packed_chunks)
        dtype = torch.bfloat16 if race is None else torch.float32
        block_maxima = torch.empty(num_rows, num_chunks, self.max_blocks_per_chunk, dtype=dtype)
        pieces: list[list[torch.Tensor]] = []
        for index, packed in enumerate(self.packed_chunks):
            start, chunk_pieces = index * self.vocab_chunk, []
            for first in range(0, num_rows, MAX_PIECE_ROWS):
                approx = onednn_linear(hidden_bf16[first : first + MAX_PIECE_ROWS], packed, None)
                rows, width = approx.shape
                values = approx
                if allowed is not None:
                    approx.masked_fill_(~allowed[first : first + rows, start : start + width], float("-inf"))
                if race is not None:
                    rows_race = slice(first, first + rows)
                    values = race_scores(approx, race.temperatures[rows_race], race.gumbel[rows_race, start : start + width])
                maxima = block_maxima[first : first + rows, index]
                blocks = _num_blocks(width)
                maxima[:, :blocks] = values.view(rows, blocks, -1).amax(dim=2)
                maxima[:, blocks:] = float("-inf")  # a short last chunk
                chunk_pieces.append(approx)
            pieces.append(chunk_pieces)
        return pieces, block_maxima

    def _candidates(
        self, pieces: list[list[torch.Tensor]], reaches: torch.Tensor, threshold: torch.Tensor, race: Race | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 3 in the blocks of tokens whose maximum reaches a row's threshold (``reaches``,
        [N, num_chunks, blocks per chunk]): (row, token id) of every candidate. Only those
        blocks' products (and noise) are read again, usually one per row."""
        rows_found, ids_found = [torch.empty(0, dtype=torch.long)], [torch.empty(0, dtype=torch.long)]
        for index in reaches.any(dim=2).any(dim=0).nonzero().squeeze(1).tolist():
            rows, blocks = reaches[:, index].nonzero(as_tuple=True)
            start = index * self.vocab_chunk
            for piece_index, approx in enumerate(pieces[index]):
                first = piece_index * MAX_PIECE_ROWS
                in_piece = (rows >= first) & (rows < first + approx.shape[0])
                piece_rows, piece_blocks = rows[in_piece], blocks[in_piece]
                if piece_rows.numel() == 0:
                    continue
                width = approx.shape[1] // _num_blocks(approx.shape[1])
                values = approx.view(approx.shape[0], -1, width)[piece_rows - first, piece_blocks].float()
                if race is not None:
                    chunk_noise = race.gumbel[:, start : start + approx.shape[1]].view(race.gumbel.shape[0], -1, width)
                    values = race_scores(values, race.temperatures[piece_rows], chunk_noise[piece_rows, piece_blocks])
                hit, column = (values >= threshold.index_select(0, piece_rows).unsqueeze(1)).nonzero(as_tuple=True)
                rows_found.append(piece_rows.index_select(0, hit))
                ids_found.append(start + piece_blocks.index_select(0, hit) * width + column)
        return torch.cat(rows_found), torch.cat(ids_found)

    @torch.inference_mode()
    def calibrate(self, float32_argmax: Callable[[torch.Tensor], list[int]]) -> None:
        """Set ``max_rows`` to the most rows (of TIMED_ROWS, up to the first that lost) at which
        the screen beat ``float32_argmax`` (the caller's path without it), timed in turns on
        random rows: 0 if it never did, None if it always did. A width is lost only if it loses
        twice: nodes calibrate while their neighbours start, and one burst must not decide."""
        generator = torch.Generator().manual_seed(0)
        best: int | None = 0
        for num_rows in TIMED_ROWS:
            hidden = torch.randn(num_rows, self.weight.shape[1], generator=generator)
            if not any(self._screen_wins(hidden, float32_argmax) for _ in range(NUM_TIMING_ROUNDS)):
                break
            best = num_rows
        else:
            best = None
        self.max_rows = best
        self.num_rows_screened = self.num_rows_unscreened = 0
        log.info("screened head: %s", "at every width" if best is None else f"up to {best} rows per step")

    def _screen_wins(self, hidden: torch.Tensor, float32_argmax: Callable[[torch.Tensor], list[int]]) -> bool:
        """One round: the fastest of up to NUM_TIMING_RUNS runs each way (fewer for wide
        ``hidden``: about TIMED_ROWS_PER_ROUND rows in all), in turns."""
        screened, full = float("inf"), float("inf")
        for _ in range(max(1, min(NUM_TIMING_RUNS, TIMED_ROWS_PER_ROUND // hidden.shape[0]))):
            started = time.perf_counter()
            self.argmax(hidden)
            screened = min(screened, time.perf_counter() - started)
            started = time.perf_counter()
            float32_argmax(hidden)
            full = min(full, time.perf_counter() - started)
        return screened < full
