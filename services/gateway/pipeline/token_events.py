"""What the pipeline yields per decode chunk (token ids, the text so far, and logprobs), and what
an embedding request ends with."""

from __future__ import annotations

from dataclasses import dataclass

# JSON has no -inf; OpenAI (and vLLM) report a token the model gives no chance as -9999.
MIN_LOGPROB = -9999.0


def finite_logprob(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def token_name(token_id: int, text: str, as_id: bool) -> str:
    """How a logprobs entry names its token: its text, or with vLLM's
    ``return_tokens_as_token_ids`` ``token_id:<id>`` (a token that is part of a character has no
    text of its own)."""
    return f"token_id:{token_id}" if as_id else text


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    token: str
    logprob: float
    # (token id, text, logprob), most likely first; or the sampled token and the ids the request
    # named (logprob_token_ids)
    top: tuple[tuple[int, str, float], ...]


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
    first_token_id: int  # the first prompt token: nothing precedes it, so it has no logprob
    first_token: str  # its text
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


@dataclass(frozen=True, slots=True)
class EmbeddingEvent:
    """An embedding request's one outcome: its prefill node's pooled vector (float32 values)."""

    embedding: list[float]
    num_prompt_tokens: int
    num_cached_tokens: int
