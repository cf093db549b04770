"""What the pipeline yields per decode chunk: token ids, the text so far, and logprobs."""

from __future__ import annotations

from dataclasses import dataclass

# JSON has no -inf; OpenAI (and vLLM) report a token the model gives no chance as -9999.
MIN_LOGPROB = -9999.0


def finite_logprob(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: str
    logprob: float
    top: tuple[tuple[str, float], ...]  # most likely first


@dataclass(frozen=True, slots=True)
class PromptTokenLogprob:
    """A prompt token's logprob given the tokens before it, its rank in the vocabulary, and the
    most likely alternatives (token id, text, logprob), most likely first."""

    token_id: int
    token: str
    logprob: float
    rank: int
    top: tuple[tuple[int, str, float], ...]


@dataclass(frozen=True, slots=True)
class PromptLogprobs:
    first_token: str  # the first prompt token's text: nothing precedes it, so it has no logprob
    entries: tuple[PromptTokenLogprob, ...]  # the second prompt token's on


@dataclass(frozen=True, slots=True)
class TokenEvent:
    token_ids: list[int]
    text: str  # full text so far
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    cached_tokens: int
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token id, when the sampling asked for them
    prompt_token_ids: tuple[int, ...] = ()  # the prompt as the model saw it (one tuple shared by every event)
    prompt_logprobs: PromptLogprobs | None = None  # on a choice's first event, when the sampling asked
