"""The sampler; what it reads and reports are the records in sampling_params.py.

Order per request: the logits processors (min_tokens, logit_bias, penalties: see
logits_processors.py), then temperature == 0 -> argmax. Otherwise logits / temperature -> min_p ->
top-k filter -> top-p (nucleus) filter over the sorted probabilities -> a race among the tokens
kept (kernels/race.py: argmax of logits / temperature + Gumbel noise, which samples
softmax(logits / temperature)). The noise is one draw over the vocabulary per request and output
token. A seeded request's draw for its token at output position k comes from a generator seeded
with ``draw_seed(seed, k)``, so it depends on nothing else: not on what else is batched, not on
the path that samples it, and not on the node (the prefill node samples the first token, a decode
node the rest, and a migrated request resumes on another). An unseeded request draws from its own
generator, seeded at random. A request with no processors, filters or logprobs never reaches
``sample``: the model runner races it without materialising logits (with ``gumbel``'s noise), as
it takes a greedy request's argmax.

``choose`` is where each row of a step takes its path: from the final hidden states, a greedy
row, or a row sampled at a temperature with nothing cut, that asks for no logprobs only needs the
argmax of its logits or of its race scores (among its grammar's allowed tokens), which the LM head
finds without the float32 logits where it can (kernels/screened_argmax.py); every other row gets
its logits, masked by its grammar, and goes through ``sample``.

Logprobs (when a request asks for them) are the model's own: log-softmax of the raw float32
logits, before temperature, top-k or top-p, as vLLM reports them by default; ties among the top
alternatives are ordered by token id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from kernels.race import Race, gumbel_from_uniform, race_scores
from services.engine.logits_processors import apply_min_p, process_logits
from services.engine.logprob_ranking import top_alternatives
from services.engine.request import Request
from services.engine.sampling_params import SamplingParams, TokenLogprobs

# Request id -> the allowed tokens of its structured output ([vocab] bool), made on demand.
AllowedTokens = Callable[[], dict[str, torch.Tensor]]


class LMHead(Protocol):
    """The decoder's last layer, as the sampler reads it (services/models/paged_decoder.py)."""

    def argmax_tokens(self, hidden: torch.Tensor, allowed: torch.Tensor | None = None, race: Race | None = None) -> list[int]: ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


@dataclass(slots=True)
class StepTokens:
    token_for: dict[str, int | SamplingError] = field(default_factory=dict)  # request id -> token, or its failure
    logprobs_for: dict[str, TokenLogprobs | None] = field(default_factory=dict)


def draw_seed(seed: int, position: int) -> int:
    """The seed of a seeded request's draw for its output token at ``position``: a hash of both,
    32 bits (torch's CPU generator keeps only those)."""
    return int.from_bytes(hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=4).digest(), "little")


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
    vocab_size: int = 0  # the race noise's width (``choose``)
    _generators: dict[str, torch.Generator] = field(default_factory=dict)  # unseeded requests' own
    _seeded: torch.Generator = field(default_factory=torch.Generator)  # reseeded for every seeded draw

    @torch.inference_mode()
    def choose(self, hidden: torch.Tensor, requests: list[Request], head: LMHead, allowed_for: AllowedTokens | None) -> StepTokens:
        """One token per request from its final hidden state (``hidden``: [N, hidden_size]), and
        its logprobs where it asked. Greedy and raced rows go to the head in separate calls: a
        greedy row in a race would need a row of zero noise as wide as the vocabulary. A row whose
        hidden state is not finite takes the logits path, which fails a sampled request on it
        alone (a greedy one gets the argmax, as it always did)."""
        if not requests:
            return StepTokens()
        finite = torch.isfinite(hidden).all(dim=1).tolist()
        wants_logits = [r.sampling.reads_logits or not ok for r, ok in zip(requests, finite)]
        full = [row for row, wants in enumerate(wants_logits) if wants]
        greedy = [row for row, wants in enumerate(wants_logits) if not wants and requests[row].sampling.is_greedy]
        raced = [row for row, wants in enumerate(wants_logits) if not wants and not requests[row].sampling.is_greedy]
        chosen = StepTokens()
        if greedy:
            greedy_requests = [requests[row] for row in greedy]
            chosen.token_for |= self._head_tokens(head, hidden, greedy_requests, greedy, allowed_for, None)
        if raced:
            raced_requests = [requests[row] for row in raced]
            race = Race.build([r.sampling.temperature for r in raced_requests], self._noise(raced_requests), hidden.device)
            chosen.token_for |= self._head_tokens(head, hidden, raced_requests, raced, allowed_for, race)
        if full:
            self._sample_logits(head.compute_logits(hidden[full]).cpu(), [requests[row] for row in full], allowed_for, chosen)
        return chosen

    def _sample_logits(self, logits: torch.Tensor, requests: list[Request], allowed_for: AllowedTokens | None, chosen: StepTokens) -> None:
        """The logits path: grammar masks, then ``sample`` and the logprobs asked for."""
        if allowed_for is not None:
            allowed = allowed_for()
            for row, request in enumerate(requests):
                if (mask := allowed.get(request.request_id)) is not None:
                    logits[row].masked_fill_(~mask, float("-inf"))
        ids, params = [r.request_id for r in requests], [r.sampling for r in requests]
        sampled = self.sample(logits, ids, params, [TokenHistory(r.prompt_token_ids, r.output_token_ids) for r in requests])
        chosen.token_for.update(zip(ids, sampled))
        token_ids = [t if isinstance(t, int) else 0 for t in sampled]  # a failed row's logprobs are never read
        chosen.logprobs_for.update(zip(ids, Sampler.logprobs(logits, token_ids, params)))

    def _head_tokens(
        self,
        head: LMHead,
        hidden: torch.Tensor,
        requests: list[Request],
        rows: list[int],
        allowed_for: AllowedTokens | None,
        race: Race | None,
    ) -> dict[str, int]:
        tokens = head.argmax_tokens(hidden[rows], self._allowed(requests, allowed_for, hidden.device), race)
        return {request.request_id: token for request, token in zip(requests, tokens)}

    def _allowed(self, requests: list[Request], allowed_for: AllowedTokens | None, device: torch.device) -> torch.Tensor | None:
        """[N, vocab] bool where any request has a grammar, else None."""
        if allowed_for is None or not any(r.sampling.has_grammar for r in requests):
            return None
        masks = allowed_for()
        everything = torch.ones(self.vocab_size, dtype=torch.bool)
        return torch.stack([masks.get(r.request_id, everything) for r in requests]).to(device)

    def _noise(self, requests: list[Request]) -> torch.Tensor:
        positions = [len(r.output_token_ids) for r in requests]
        return self.gumbel([r.request_id for r in requests], [r.sampling for r in requests], positions, self.vocab_size)

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
                    gumbel = self.gumbel([request_id], [p], [len(history.output_token_ids)], processed.shape[-1])[0]
                    out.append(self._sample_one(processed, gumbel, p))
            except (RuntimeError, ValueError) as exc:  # e.g. NaN logits
                out.append(SamplingError(f"sampling failed for this request: {exc}"))
        return out

    @staticmethod
    def logprobs(logits: torch.Tensor, token_ids: list[int], params: list[SamplingParams]) -> list[TokenLogprobs | None]:
        """For each row whose request asked for logprobs: the sampled token's and the top ones
        (or, with ``logprob_token_ids``, those ids' after the sampled token's)."""
        wanted = [i for i, p in enumerate(params) if p.logprobs is not None]
        out: list[TokenLogprobs | None] = [None] * len(params)
        if not wanted:
            return out
        logprobs = torch.log_softmax(logits[wanted].float(), dim=-1)
        k = max((params[i].logprobs or 0 for i in wanted if params[i].logprob_token_ids is None), default=0)
        tops = top_alternatives(logprobs, k)
        for row, i in enumerate(wanted):
            top = tops[row][: params[i].logprobs or 0]
            if (named := params[i].logprob_token_ids) is not None:
                ids = list(dict.fromkeys((token_ids[i], *named)))
                top = tuple(zip(ids, logprobs[row, ids].tolist()))
            out[i] = TokenLogprobs(token_ids[i], float(logprobs[row, token_ids[i]]), top)
        return out

    def gumbel(self, request_ids: list[str], params: list[SamplingParams], positions: list[int], vocab_size: int) -> torch.Tensor:
        """The race noise for these requests' tokens at output ``positions``, [N, vocab] float32:
        the same draw whichever path then samples it."""
        uniform = torch.empty(len(request_ids), vocab_size)
        for row, (request_id, p, position) in enumerate(zip(request_ids, params, positions)):
            torch.rand(vocab_size, generator=self._generator(request_id, p, position), out=uniform[row])
        return gumbel_from_uniform(uniform)

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def _generator(self, request_id: str, params: SamplingParams, position: int) -> torch.Generator:
        if params.seed is not None:
            return self._seeded.manual_seed(draw_seed(params.seed, position))
        generator = self._generators.get(request_id)
        if generator is None:
            generator = torch.Generator()
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
