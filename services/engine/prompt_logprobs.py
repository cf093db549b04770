"""Prompt logprobs: for each prompt token from the second on, its logprob given the tokens before
it, its rank in the vocabulary, and the most likely alternatives (vLLM's ``prompt_logprobs``).

The hidden state at prompt position p predicts the token at p + 1, so a step that computes
positions [start, end) of a prompt reports tokens start + 1 .. min(end, num_prompt_tokens - 1);
the last prompt position predicts the first output token, which the sampler reports. Values are
the log-softmax of the raw float32 logits, as the sampler's logprobs. A request that asks for
them computes its whole prompt (the KV cache manager reports no cached prefix for it): logits of
a cached prefix were never kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.engine.logprob_ranking import top_alternatives
from services.engine.request import Request
from services.engine.sampling_params import PromptTokenLogprobs

# Rows of float32 logits materialised at once: a long prompt over a 262k vocabulary would
# otherwise need gigabytes in one step (64 rows of it: 64 MiB).
LOGIT_ROWS_PER_PASS = 64


@dataclass(slots=True)
class PromptRows:
    """One request's prompt rows of a step: hidden states of positions [start, start + len)."""

    request: Request
    start: int
    hidden: torch.Tensor  # [n, hidden_size]


def prompt_rows_of(request: Request, start: int, end: int) -> range:
    """The positions in [start, end) whose hidden states predict a prompt token: empty unless the
    request asks for prompt logprobs."""
    if request.sampling.prompt_logprobs is None:
        return range(0)
    return range(start, min(end, request.num_prompt_tokens - 1))


@torch.inference_mode()
def record_prompt_logprobs(rows: PromptRows, compute_logits) -> None:
    """Compute and file ``rows``' prompt logprobs on their request (``Request.prompt_logprobs``,
    entry i for prompt token i + 1). A recomputed range (after a preemption) replaces what it
    covers."""
    request, k = rows.request, rows.request.sampling.prompt_logprobs or 0
    targets = request.prompt_token_ids[rows.start + 1 : rows.start + 1 + rows.hidden.shape[0]]
    out: list[PromptTokenLogprobs] = []
    for lo in range(0, rows.hidden.shape[0], LOGIT_ROWS_PER_PASS):
        logprobs = torch.log_softmax(compute_logits(rows.hidden[lo : lo + LOGIT_ROWS_PER_PASS]).float(), dim=-1)
        out.extend(_records(logprobs, targets[lo : lo + LOGIT_ROWS_PER_PASS], k))
    del request.prompt_logprobs[rows.start :]
    request.prompt_logprobs.extend(out)


def _records(logprobs: torch.Tensor, targets: list[int], k: int) -> list[PromptTokenLogprobs]:
    target_ids = torch.tensor(targets, dtype=torch.long, device=logprobs.device)
    chosen = logprobs.gather(1, target_ids[:, None])[:, 0]
    ranks = (logprobs > chosen[:, None]).sum(dim=1) + 1
    tops = top_alternatives(logprobs, k)
    return [
        PromptTokenLogprobs(token_id, value, rank, top)
        for token_id, value, rank, top in zip(targets, chosen.tolist(), ranks.tolist(), tops)
    ]
