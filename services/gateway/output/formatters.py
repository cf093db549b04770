"""How each endpoint spells its results: chat completions (message / delta) and text completions
(text), as full responses and as stream chunks. The streaming and fan-out logic is shared
(services/gateway/http/responses.py) and calls one of these."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pydantic import BaseModel

from services.gateway.output.chat_chunks import ChatCompletionChunk, ChunkChoice, ChunkDelta, DeltaFunction, DeltaToolCall
from services.gateway.output.logprobs import chat_logprobs, completion_logprobs, echoed_logprobs, prompt_logprobs_wire
from services.gateway.output.tool_calls import ToolMode, new_call_id
from services.gateway.pipeline.token_events import PromptLogprobs, TokenLogprob
from services.gateway.protocol.chat import ToolCall, ToolCallFunction
from services.gateway.protocol.completion import CompletionChoice, CompletionLogprobs, CompletionResponse
from services.gateway.protocol.responses import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionResponse,
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
    logprobs: list[TokenLogprob] | None = None  # None: not asked for
    text_offsets: list[int] = field(default_factory=list)  # of each logprobs token in the text
    token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: tuple[int, ...] = ()
    num_ids_sent: int = 0  # of token_ids, in a stream's chunks so far (return_token_ids)
    prompt_ids_sent: bool = False  # a stream's prompt_token_ids went out (on its first chunk)
    prompt_logprobs: PromptLogprobs | None = None  # when the sampling asked for them

    def new_ids(self, asked: bool) -> tuple[list[int] | None, list[int] | None]:
        """(the prompt's ids on the choice's first chunk, the ids since the last chunk), when
        ``asked`` (return_token_ids); (None, None) otherwise."""
        if not asked:
            return None, None
        prompt = None if self.prompt_ids_sent else list(self.prompt_token_ids)
        self.prompt_ids_sent = True
        new, self.num_ids_sent = self.token_ids[self.num_ids_sent :], len(self.token_ids)
        return prompt, new

    def add_logprobs(self, new: Sequence[TokenLogprob]) -> None:
        if self.logprobs is None:
            return
        offset = self.text_offsets[-1] + len(self.logprobs[-1].token) if self.logprobs else 0
        for logprob in new:
            self.text_offsets.append(offset)
            self.logprobs.append(logprob)
            offset += len(logprob.token)


class Formatter(Protocol):
    id_prefix: str

    def opening(self, request_id: str, model: str, index: int, prompt_index: int = 0) -> BaseModel | None:
        """The chunk that opens a choice's stream, if the endpoint has one."""

    def delta(self, request_id: str, model: str, result: ChoiceResult, text: str, num_new_logprobs: int) -> BaseModel:
        """A chunk with ``result``'s new ``text`` and its last ``num_new_logprobs`` logprobs."""

    def usage_chunk(self, request_id: str, model: str, usage: Usage) -> BaseModel: ...

    def response(self, request_id: str, model: str, choices: list[ChoiceResult], usage: Usage) -> BaseModel: ...


class ChatFormatter:
    """``tool_mode``: how the output becomes tool calls (tool_calls.py); None: plain content.
    ``echo``: text each reply starts with (chat ``echo``), streamed with the role; one per prompt
    (the batch endpoint's conversations), or one for all. ``tokens_as_ids``: logprobs name tokens
    ``token_id:<id>`` (vLLM's return_tokens_as_token_ids)."""

    id_prefix = "chatcmpl"

    def __init__(
        self,
        tool_mode: ToolMode | None = None,
        echo: str | Sequence[str] = "",
        return_token_ids: bool = False,
        tokens_as_ids: bool = False,
    ) -> None:
        self.tool_mode = tool_mode
        self.echoes = echo
        self.return_token_ids = return_token_ids
        self.tokens_as_ids = tokens_as_ids
        self._num_sent: dict[int, int] = {}  # choice -> characters of its text streamed so far

    def echo(self, prompt_index: int) -> str:
        return self.echoes if isinstance(self.echoes, str) else self.echoes[prompt_index]

    def opening(self, request_id: str, model: str, index: int, prompt_index: int = 0) -> ChatCompletionChunk:
        delta = ChunkDelta(role="assistant", content=self.echo(prompt_index))
        return _chat_chunk(request_id, model, [ChunkChoice(index=index, delta=delta)])

    def delta(self, request_id: str, model: str, result: ChoiceResult, text: str, num_new_logprobs: int) -> ChatCompletionChunk:
        logprobs = chat_logprobs(result.logprobs, num_new_logprobs, self.tokens_as_ids)
        delta, finish_reason = ChunkDelta(content=text or None), result.finish_reason
        if self.tool_mode is not None:
            delta, finish_reason = self._tool_delta(result)
        prompt_ids, ids = result.new_ids(self.return_token_ids)
        choice = ChunkChoice(index=result.index, delta=delta, finish_reason=finish_reason, logprobs=logprobs, token_ids=ids)
        chunk = _chat_chunk(request_id, model, [choice])
        chunk.prompt_token_ids = prompt_ids
        return chunk

    def usage_chunk(self, request_id: str, model: str, usage: Usage) -> ChatCompletionChunk:
        return _chat_chunk(request_id, model, [], usage)

    def response(self, request_id: str, model: str, choices: list[ChoiceResult], usage: Usage) -> ChatCompletionResponse:
        out = []
        for c in choices:
            echo = self.echo(c.prompt_index)
            message, finish_reason = AssistantMessage(content=echo + c.text), c.finish_reason or "stop"
            if self.tool_mode is not None:
                parsed = self.tool_mode.parse(c.text, finish_reason)
                calls = [ToolCall(id=p.id, function=ToolCallFunction(name=p.name, arguments=p.arguments)) for p in parsed.calls]
                content = echo + parsed.content if parsed.content is not None else echo or None
                message = AssistantMessage(content=content, tool_calls=calls)
                finish_reason = parsed.finish_reason or finish_reason
            logprobs = chat_logprobs(c.logprobs, len(c.logprobs or ()), self.tokens_as_ids)
            ids = c.token_ids if self.return_token_ids else None
            out.append(ChatChoice(index=c.index, message=message, finish_reason=finish_reason, logprobs=logprobs, token_ids=ids))
        # One prompt's ids and logprobs go on the response; the batch endpoint's several have none.
        one_prompt = len({c.prompt_index for c in choices}) == 1
        prompt_ids = list(choices[0].prompt_token_ids) if self.return_token_ids and one_prompt else None
        scored = next((c.prompt_logprobs for c in choices if c.prompt_logprobs is not None and one_prompt), None)
        return ChatCompletionResponse(
            id=request_id,
            created=int(time.time()),
            model=model,
            choices=out,
            usage=usage,
            prompt_token_ids=prompt_ids,
            prompt_logprobs=prompt_logprobs_wire(scored) if scored is not None else None,
        )

    def _tool_delta(self, result: ChoiceResult) -> tuple[ChunkDelta, str | None]:
        """What of the output may go out now: content, a named call's arguments, and at the end
        the calls parsed from the whole output."""
        mode, sent = self.tool_mode, self._num_sent.get(result.index, 0)
        assert mode is not None
        if mode.kind == "named":
            self._num_sent[result.index] = len(result.text)
            function = DeltaFunction(name=mode.function if sent == 0 else None, arguments=result.text[sent:])
            call = DeltaToolCall(
                index=0, id=new_call_id() if sent == 0 else None, type="function" if sent == 0 else None, function=function
            )
            return ChunkDelta(tool_calls=[call]), result.finish_reason
        if result.finish_reason is None:
            streamable = mode.streamable_content(result.text)
            self._num_sent[result.index] = max(sent, len(streamable))
            return ChunkDelta(content=streamable[sent:] or None), None
        parsed = mode.parse(result.text, result.finish_reason)
        if not parsed.calls:
            return ChunkDelta(content=result.text[sent:] or None), result.finish_reason
        calls = [
            DeltaToolCall(index=i, id=p.id, type="function", function=DeltaFunction(name=p.name, arguments=p.arguments))
            for i, p in enumerate(parsed.calls)
        ]
        return ChunkDelta(tool_calls=calls), parsed.finish_reason or result.finish_reason


class CompletionFormatter:
    """``echoes``: each prompt's text, by prompt index, that its choices start with (``echo``),
    with its tokens' logprobs first when logprobs are asked for; ``echo_only`` (max_tokens 0):
    the echo alone, the one token sampled to score the prompt left out."""

    id_prefix = "cmpl"

    def __init__(
        self, return_token_ids: bool = False, echoes: Sequence[str] = (), echo_only: bool = False, tokens_as_ids: bool = False
    ) -> None:
        self.return_token_ids = return_token_ids
        self.echoes = echoes
        self.echo_only = echo_only
        self.tokens_as_ids = tokens_as_ids
        self._echoed: set[int] = set()  # choices whose stream carried their echo

    def _echo(self, result: ChoiceResult) -> str:
        return self.echoes[result.prompt_index] if self.echoes else ""

    def opening(self, request_id: str, model: str, index: int, prompt_index: int = 0) -> None:
        return None

    def delta(self, request_id: str, model: str, result: ChoiceResult, text: str, num_new_logprobs: int) -> CompletionResponse:
        prompt_ids, ids = result.new_ids(self.return_token_ids)
        echoing = bool(self.echoes) and result.index not in self._echoed
        if echoing:
            self._echoed.add(result.index)
        if self.echo_only:
            text, num_new_logprobs = "", 0
        logprobs = self._logprobs(result, num_new_logprobs, echoing)
        if echoing:
            text = self._echo(result) + text
        choice = CompletionChoice(
            index=result.index, text=text, finish_reason=result.finish_reason, logprobs=logprobs, prompt_token_ids=prompt_ids, token_ids=ids
        )
        return CompletionResponse(id=request_id, created=int(time.time()), model=model, choices=[choice])

    def usage_chunk(self, request_id: str, model: str, usage: Usage) -> CompletionResponse:
        return CompletionResponse(id=request_id, created=int(time.time()), model=model, choices=[], usage=usage)

    def response(self, request_id: str, model: str, choices: list[ChoiceResult], usage: Usage) -> CompletionResponse:
        asked = self.return_token_ids
        out = [
            CompletionChoice(
                index=c.index,
                text=self._echo(c) + ("" if self.echo_only else c.text),
                finish_reason=c.finish_reason or "stop",
                logprobs=self._logprobs(c, 0 if self.echo_only else len(c.logprobs or ()), bool(self.echoes)),
                prompt_token_ids=list(c.prompt_token_ids) if asked else None,
                token_ids=c.token_ids if asked else None,
                prompt_logprobs=prompt_logprobs_wire(c.prompt_logprobs) if c.prompt_logprobs is not None else None,
            )
            for c in choices
        ]
        return CompletionResponse(id=request_id, created=int(time.time()), model=model, choices=out, usage=usage)

    def _logprobs(self, result: ChoiceResult, num_last: int, echoing: bool) -> CompletionLogprobs | None:
        """The last ``num_last`` output logprobs, after the echoed prompt's when ``echoing``."""
        output = completion_logprobs(result.logprobs, result.text_offsets, num_last, self.tokens_as_ids)
        if not echoing or output is None or result.prompt_logprobs is None:
            return output
        texts, names, values, tops = echoed_logprobs(result.prompt_logprobs, self.tokens_as_ids)
        offsets = list(itertools.accumulate((len(t) for t in texts[:-1]), initial=0))
        shift = len(self._echo(result))
        return CompletionLogprobs(
            tokens=names + output.tokens,
            token_logprobs=values + output.token_logprobs,
            top_logprobs=tops + list(output.top_logprobs or ()),
            text_offset=offsets + [shift + offset for offset in output.text_offset],
        )


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
