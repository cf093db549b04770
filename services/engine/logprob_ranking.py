"""The k most likely tokens of each row of log-probabilities, most likely first, ties by token id:
the alternatives that output and prompt logprobs report. A few (OpenAI's 20) are a top-k and a
sort of k pairs; many (up to the whole vocabulary, under --max-logprobs -1) are one stable sort
of the row, which orders ties by id as it goes."""

from __future__ import annotations

import torch

# Past this many, a stable sort of the whole row beats sorting the top-k's pairs in Python.
MAX_PAIRS_SORTED_IN_PYTHON = 64


def top_alternatives(logprobs: torch.Tensor, k: int) -> list[tuple[tuple[int, float], ...]]:
    """``logprobs``: [rows, vocab] -> per row, its k (token id, logprob) pairs."""
    if k <= 0:
        return [()] * logprobs.shape[0]
    if k <= MAX_PAIRS_SORTED_IN_PYTHON:
        # Every token at least as likely as the k-th (more than k on a tie there), then the
        # first k of them by (logprob, id): a plain top-k would pick among tied tokens at random.
        kth = logprobs.topk(k, dim=-1).values[:, -1:]
        out = []
        for row, threshold in zip(logprobs, kth):
            ids = (row >= threshold).nonzero().flatten()
            pairs = zip(ids.tolist(), row[ids].tolist())
            out.append(tuple(sorted(pairs, key=lambda pair: (-pair[1], pair[0]))[:k]))
        return out
    values, ids = logprobs.sort(dim=-1, descending=True, stable=True)
    return [tuple(zip(row_ids, row_values)) for row_ids, row_values in zip(ids[:, :k].tolist(), values[:, :k].tolist())]
