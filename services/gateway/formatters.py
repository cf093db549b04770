"""How each endpoint spells its results: chat completions (message / delta) and text completions
(text), as full responses and as stream chunks. The streaming and fan-out logic is shared
(services/gateway/responses.py) and calls one of these."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel

from services.gateway.completion_protocol import CompletionChoice, CompletionResponse
from services.gateway.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChunkChoice,
    ChunkDelta,
    PromptTokensDetails,
    Usage,
)


@dataclass(slots=True)
class ChoiceResult:
    """One choice's outcome, accumulated from its token events."""

    index: int
    prompt_index: int
    text: str = ""
    finish_reason: str | None = None
    num_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0


class Formatter(Protocol):
    id_prefix: str

    def opening(self, request_id: str, model: str, index: int) -> BaseModel | None:
        """The chunk that opens a choice's stream, if the endpoint has one."""

    def delta(self, request_id: str, model: str, index: int, text: str, finish_reason: str | None) -> BaseModel: ...

    def usage_chunk(self, request_id: str, model: str, usage: Usage) -> BaseModel: ...

    def response(self, request_id: str, model: str, choices: list[ChoiceResult], usage: Usage) -> BaseModel: ...


class ChatFormatter:
    id_prefix = "chatcmpl"

    def opening(self, request_id: str, model: str, index: int) -> ChatCompletionChunk:
        return _chat_chunk(request_id, model, [ChunkChoice(index=index, delta=ChunkDelta(role="assistant", content=""))])

    def delta(self, request_id: str, model: str, index: int, text: str, finish_reason: str | None) -> ChatCompletionChunk:
        choice = ChunkChoice(index=index, delta=ChunkDelta(content=text or None), finish_reason=finish_reason)
        return _chat_chunk(request_id, model, [choice])

    def usage_chunk(self, request_id: str, model: str, usage: Usage) -> ChatCompletionChunk:
        return _chat_chunk(request_id, model, [], usage)

    def response(self, request_id: str, model: str, choices: list[ChoiceResult], usage: Usage) -> ChatCompletionResponse:
        out = [
            ChatChoice(index=c.index, message=AssistantMessage(content=c.text), finish_reason=c.finish_reason or "stop") for c in choices
        ]
        return ChatCompletionResponse(id=request_id, created=int(time.time()), model=model, choices=out, usage=usage)


class CompletionFormatter:
    id_prefix = "cmpl"

    def opening(self, request_id: str, model: str, index: int) -> None:
        return None

    def delta(self, request_id: str, model: str, index: int, text: str, finish_reason: str | None) -> CompletionResponse:
        choice = CompletionChoice(index=index, text=text, finish_reason=finish_reason)
        return CompletionResponse(id=request_id, created=int(time.time()), model=model, choices=[choice])

    def usage_chunk(self, request_id: str, model: str, usage: Usage) -> CompletionResponse:
        return CompletionResponse(id=request_id, created=int(time.time()), model=model, choices=[], usage=usage)

    def response(self, request_id: str, model: str, choices: list[ChoiceResult], usage: Usage) -> CompletionResponse:
        out = [CompletionChoice(index=c.index, text=c.text, finish_reason=c.finish_reason or "stop") for c in choices]
        return CompletionResponse(id=request_id, created=int(time.time()), model=model, choices=out, usage=usage)


def usage_of(choices: list[ChoiceResult]) -> Usage:
    """OpenAI's accounting: each prompt counted once (its cached tokens from its first choice),
    every choice's completion tokens summed."""
    per_prompt: dict[int, ChoiceResult] = {}
    for choice in sorted(choices, key=lambda c: c.index):
        per_prompt.setdefault(choice.prompt_index, choice)
    prompt_tokens = sum(c.prompt_tokens for c in per_prompt.values())
    completion_tokens = sum(c.num_tokens for c in choices)
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=sum(c.cached_tokens for c in per_prompt.values())),
    )


def _chat_chunk(request_id: str, model: str, choices: list[ChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
    return ChatCompletionChunk(id=request_id, created=int(time.time()), model=model, choices=choices, usage=usage)
