"""The sampler; what it reads and reports are the records in sampling_params.py.

Order per request: the logits processors (min_tokens, logit_bias, penalties: see
logits_processors.py), then temperature == 0 -> argmax. Otherwise logits / temperature -> min_p ->
top-k filter -> top-p (nucleus) filter over the sorted probabilities -> a race among the tokens
kept (kernels/race.py: argmax of logits / temperature + Gumbel noise, which samples
softmax(logits / temperature)). The noise is one draw over the vocabulary per request and step,
from the request's own generator, seeded from ``seed`` when given, so a seeded request is
reproducible whatever else is batched and whichever path samples it: a request with no
processors, filters or logprobs never reaches here, since the model runner races it without
materialising logits (``gumbel``), as it takes a greedy request's argmax.

Logprobs (when a request asks for them) are the model's own: log-softmax of the raw float32
logits, before temperature, top-k or top-p, as vLLM reports them by default; ties among the top
alternatives are ordered by token id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from kernels.race import gumbel_from_uniform, race_scores
from services.engine.logits_processors import apply_min_p, process_logits
from services.engine.sampling_params import SamplingParams, TokenLogprobs


class SamplingError(Exception):
    """One request's sampling failed; the request fails, the batch goes on."""


@dataclass(frozen=True, slots=True)
class TokenHistory:
    """What the penalties and min_tokens read: the request's tokens so far."""

    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]


@dataclass(slots=True)
class Sampler:
    eos_token_ids: frozenset[int] = frozenset()
    _generators: dict[str, torch.Generator] = field(default_factory=dict)

    def sample(
        self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams], histories: list[TokenHistory]
    ) -> list[int | SamplingError]:
        """logits: [num_reqs, vocab] float32 -> one token per request, or the SamplingError that
        request's own sampling raised (its logits, its parameters): one request's failure is
        its own, never the batch's."""
        greedy = logits.argmax(dim=-1).tolist()
        out: list[int | SamplingError] = []
        for row, request_id, p, history in zip(range(logits.shape[0]), request_ids, params, histories):
            if p.is_greedy and not p.has_logits_processors:
                out.append(greedy[row])
                continue
            try:
                processed = process_logits(logits[row], p, history.prompt_token_ids, history.output_token_ids, self.eos_token_ids)
                if p.is_greedy:
                    out.append(int(processed.argmax()))
                else:
                    out.append(self._sample_one(processed, self.gumbel([request_id], [p], processed.shape[-1])[0], p))
            except (RuntimeError, ValueError) as exc:  # e.g. NaN logits
                out.append(SamplingError(f"sampling failed for this request: {exc}"))
        return out

    @staticmethod
    def logprobs(logits: torch.Tensor, token_ids: list[int], params: list[SamplingParams]) -> list[TokenLogprobs | None]:
        """For each row whose request asked for logprobs: the sampled token's and the top ones."""
        wanted = [i for i, p in enumerate(params) if p.logprobs is not None]
        out: list[TokenLogprobs | None] = [None] * len(params)
        if not wanted:
            return out
        logprobs = torch.log_softmax(logits[wanted].float(), dim=-1)
        k = max(params[i].logprobs or 0 for i in wanted)
        top_values, top_ids = logprobs.topk(k, dim=-1) if k else (None, None)
        for row, i in enumerate(wanted):
            top: tuple[tuple[int, float], ...] = ()
            if params[i].logprobs:
                pairs = zip(top_ids[row].tolist(), top_values[row].tolist())
                top = tuple(sorted(pairs, key=lambda pair: (-pair[1], pair[0]))[: params[i].logprobs])
            out[i] = TokenLogprobs(token_ids[i], float(logprobs[row, token_ids[i]]), top)
        return out

    def gumbel(self, request_ids: list[str], params: list[SamplingParams], vocab_size: int) -> torch.Tensor:
        """One step's race noise for these requests, [N, vocab] float32: a row per request, each
        from its own generator (the same draw whichever path then samples it)."""
        uniform = torch.empty(len(request_ids), vocab_size)
        for row, (request_id, p) in enumerate(zip(request_ids, params)):
            torch.rand(vocab_size, generator=self._generator(request_id, p), out=uniform[row])
        return gumbel_from_uniform(uniform)

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator:
        generator = self._generators.get(request_id)
        if generator is None:
            generator = torch.Generator()
            if params.seed is not None:
                generator.manual_seed(params.seed)
            else:
                generator.seed()
            self._generators[request_id] = generator
        return generator

    @staticmethod
    def _sample_one(logits: torch.Tensor, gumbel: torch.Tensor, p: SamplingParams) -> int:
        temperature = torch.tensor(p.temperature, dtype=torch.float32)
        scaled = logits.float() / temperature
        if torch.isnan(scaled).any():
            raise ValueError("the logits contain NaN")
        keep = scaled > float("-inf")
        if p.top_k > 0 and p.top_k < scaled.numel():
            keep &= scaled >= torch.topk(scaled, p.top_k).values[-1]
        if p.min_p > 0.0 or p.top_p < 1.0:
            probs = apply_min_p(torch.softmax(scaled.masked_fill(~keep, float("-inf")), dim=-1), p.min_p)
            if p.top_p < 1.0:
                sorted_probs, order = probs.sort(descending=True)
                # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
                drop = sorted_probs.cumsum(0) - sorted_probs >= p.top_p
                probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs.masked_fill(drop, 0.0))
            keep &= probs > 0
        if not keep.any():
            raise ValueError("no token has a finite logit")
        return int(race_scores(logits, temperature, gumbel).masked_fill(~keep, float("-inf")).argmax())
