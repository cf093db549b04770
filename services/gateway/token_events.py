"""What the pipeline yields per decode chunk: token ids, the text so far, and logprobs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: str
    logprob: float
    top: tuple[tuple[str, float], ...]  # most likely first


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
