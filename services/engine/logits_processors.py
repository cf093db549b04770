"""Per-request logits processors, with vLLM's semantics and in vLLM's order.

Order, on one request's raw float32 logits row:
  0. allowed_token_ids: every other token gets -inf.
  1. min_tokens: while fewer than ``min_tokens`` tokens are out, the stop tokens (EOS unless
     ignore_eos, and stop_token_ids) get -inf.
  2. logit_bias: added to the logits of the named tokens.
  3. penalties, over the token history:
       repetition (prompt and output tokens): a positive logit is divided by it, a negative one
       multiplied, so a seen token always loses (vLLM and transformers' CTRL rule);
       frequency (output tokens): minus frequency_penalty times the token's output count;
       presence (output tokens): minus presence_penalty once for any token in the output.
Then the sampler: argmax when greedy, else temperature -> min_p -> top-k -> top-p -> draw.
min_p keeps tokens whose probability is at least ``min_p`` times the most likely one's, after
temperature; it never changes the argmax, so greedy requests skip it.

Logprobs stay the model's own (taken before any of this), as vLLM reports them by default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from services.engine.sampling_params import SamplingParams


def process_logits(
    logits: torch.Tensor,
    params: SamplingParams,
    prompt_token_ids: Sequence[int],
    output_token_ids: Sequence[int],
    eos_token_ids: frozenset[int],
) -> torch.Tensor:
    """One request's logits row [vocab] after steps 1-3; the input is not modified."""
    if not params.has_logits_processors:
        return logits
    logits = logits.float().clone()
    if params.allowed_token_ids is not None:
        allowed = torch.full_like(logits, float("-inf"))
        ids = torch.tensor(params.allowed_token_ids, dtype=torch.long)
        logits = allowed.index_copy_(0, ids, logits[ids])
    if len(output_token_ids) < params.min_tokens:
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        in_vocab = [t for t in stop_ids if 0 <= t < logits.numel()]
        logits[in_vocab] = float("-inf")
    if params.logit_bias:
        ids = torch.tensor([t for t, _ in params.logit_bias], dtype=torch.long)
        logits.index_add_(0, ids, torch.tensor([b for _, b in params.logit_bias], dtype=logits.dtype))
    return apply_penalties(logits, params, prompt_token_ids, output_token_ids)


def apply_penalties(
    logits: torch.Tensor, params: SamplingParams, prompt_token_ids: Sequence[int], output_token_ids: Sequence[int]
) -> torch.Tensor:
    vocab = logits.numel()
    output = torch.tensor([t for t in output_token_ids if t < vocab], dtype=torch.long)
    if params.repetition_penalty != 1.0:
        prompt = torch.tensor([t for t in prompt_token_ids if t < vocab], dtype=torch.long)
        seen = torch.zeros(vocab, dtype=torch.bool)
        seen[prompt] = True
        seen[output] = True
        penalised = torch.where(logits > 0, logits / params.repetition_penalty, logits * params.repetition_penalty)
        logits = torch.where(seen, penalised, logits)
    if params.frequency_penalty != 0.0 or params.presence_penalty != 0.0:
        counts = torch.bincount(output, minlength=vocab).to(logits.dtype)
        logits = logits - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def apply_min_p(probs: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop the probabilities below ``min_p`` times the largest, and renormalise (top-p then
    reads the kept mass, as it does after vLLM's min_p)."""
    if min_p <= 0.0:
        return probs
    kept = probs.masked_fill(probs < min_p * probs.max(), 0.0)
    return kept / kept.sum()
