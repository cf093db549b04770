"""Turns sampled tokens into request progress: detokenize, apply stop conditions, finish.

Stop order for each new token: stop token (EOS unless ignore_eos, plus stop_token_ids) ->
stop string (the text is cut before the match, as OpenAI does; not before min_tokens) ->
max_tokens.

Holdback: with stop strings, a request's released text (``output_text``, what streams see) stops
short of any tail that could still grow into a stop string ("...EN" while "END" is a stop), so a
stream never sends characters that the final, cut text does not contain. The tail is released
when it stops matching, or when the request finishes for another reason. A trailing U+FFFD
(a character whose UTF-8 bytes are split across tokens) is held back the same way until the
next token completes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.engine.detokenizer import IncrementalDetokenizer
from services.engine.request import Request, RequestStatus
from services.engine.sampling_params import PromptTokenLogprobs, TokenLogprobs
from shared.holdback import num_held_back


@dataclass(frozen=True, slots=True)
class RequestOutput:
    request_id: str
    new_token_ids: list[int]
    output_token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_cached_tokens: int
    new_logprobs: list[TokenLogprobs] = field(default_factory=list)  # one per new token, when asked for
    # With the first output token, when the sampling asks for them: prompt token i + 1's at i.
    prompt_logprobs: list[PromptTokenLogprobs] | None = None
    embedding: list[float] | None = None  # an embedding request's, when it finished (pooler.py)


class OutputProcessor:
    def __init__(self, tokenizer, eos_token_ids: tuple[int, ...]) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.detokenizer = IncrementalDetokenizer(tokenizer, self.eos_token_ids)

    def append_token(self, request: Request, token_id: int) -> RequestStatus | None:
        """Record ``token_id``; returns the finish status if the request is now done."""
        request.output_token_ids.append(token_id)
        params = request.sampling
        if (not params.ignore_eos and token_id in self.eos_token_ids) or token_id in params.stop_token_ids:
            request.output_text = self._decode(request)
            return RequestStatus.FINISHED_STOPPED
        if params.stop:
            text = self._decode(request)
            # As vLLM: stop strings count only once the output is past min_tokens (stop tokens
            # cannot be drawn before it: the min_tokens processor masks them), and only where
            # they could end in new text: text already released never holds a counted match.
            if len(request.output_token_ids) > params.min_tokens:
                start = max(0, len(request.output_text) - max(map(len, params.stop)) + 1)
                cut = min((i for i in (text.find(s, start) for s in params.stop) if i >= 0), default=-1)
                if cut >= 0:
                    request.output_text = text[:cut]
                    return RequestStatus.FINISHED_STOPPED
            request.output_text = releasable(text[: len(text) - num_held_back(text, params.stop)])
        if len(request.output_token_ids) >= params.max_tokens:
            request.output_text = self._decode(request)
            return RequestStatus.FINISHED_LENGTH
        return None

    def finish_stopped(self, request: Request) -> RequestStatus:
        """End the request as stopped where it is (its grammar is complete)."""
        request.output_text = self._decode(request)
        return RequestStatus.FINISHED_STOPPED

    def snapshot(self, request: Request, new_token_ids: list[int], new_logprobs: list[TokenLogprobs] | None = None) -> RequestOutput:
        finished = request.status.is_finished
        if not request.sampling.stop and not finished:
            request.output_text = releasable(self._decode(request))
        return RequestOutput(
            request_id=request.request_id,
            new_token_ids=new_token_ids,
            output_token_ids=list(request.output_token_ids),
            text=request.output_text,
            finished=finished,
            finish_reason=request.status.value if finished else None,
            num_prompt_tokens=request.num_prompt_tokens,
            num_cached_tokens=request.num_cached_tokens or 0,
            new_logprobs=list(new_logprobs or ()),
            prompt_logprobs=_first_output_prompt_logprobs(request),
        )

    def _decode(self, request: Request) -> str:
        """The output's text without EOS and special tokens, decoded incrementally."""
        return self.detokenizer.text(request.detokenizer, request.output_token_ids)


def _first_output_prompt_logprobs(request: Request) -> list[PromptTokenLogprobs] | None:
    if request.sampling.prompt_logprobs is None or len(request.output_token_ids) != 1:
        return None
    return list(request.prompt_logprobs)


def releasable(text: str) -> str:
    """``text`` without trailing replacement characters: bytes of a character still arriving."""
    return text.rstrip("\ufffd")
