"""A request's choices turned into an HTTP response: one JSON body, or server-sent events.

A stream's status line waits for the first token, so failures before it (a bad image, no live
node) get a real status code; a failure after it ends the stream with an error event and no
[DONE]. Text deltas are cut from each event's released text, which only grows (the engine holds
back stop-string prefixes and split characters), so nothing is ever sent twice.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from services.gateway.errors import GatewayError
from services.gateway.frontend.limits import Ticket
from services.gateway.frontend.media_budget import MediaTicket
from services.gateway.frontend.openai_api import ApiRequest, Generation
from services.gateway.http.unexpected_errors import unexpected_error
from services.gateway.output.formatters import ChoiceResult, Formatter, usage_of
from services.gateway.pipeline.beam_search import beam_events
from services.gateway.pipeline.choices import merged_events
from services.gateway.pipeline.token_events import TokenEvent
from services.gateway.protocol.responses import Usage
from services.gateway.state import GatewayState


async def respond(
    state: GatewayState, request: ApiRequest, formatter: Formatter, ticket: Ticket, media: MediaTicket | None = None
) -> JSONResponse | EventStreamResponse:
    """The response; ``ticket`` (the request's admission) is released when its work ends, and
    ``media`` (its images' share of the media budget) at its first token: they are encoded by then."""
    media = media or MediaTicket(None, 0)
    if request.stream:
        return await _start_stream(state, request, formatter, ticket, media)
    try:
        return await _complete(state, request, formatter, media)
    finally:
        media.release()
        ticket.release()


async def _complete(state: GatewayState, request: ApiRequest, formatter: Formatter, media: MediaTicket) -> JSONResponse:
    started = time.monotonic()
    results = _results(request)
    async for generation, event in _choice_events(state, request, stream=False):
        media.release()
        if not any(r.num_tokens for r in results.values()):
            state.metrics.record_ttft(time.monotonic() - started)
        _accumulate(results[generation.index], event)
    state.metrics.record_e2e(time.monotonic() - started)
    choices = sorted(results.values(), key=lambda r: r.index)
    usage = usage_of(choices)
    body = formatter.response(_request_id(formatter), request.model, choices, usage)
    state.metrics.record_request(200)
    _record_finished(state, usage, choices)
    return JSONResponse(body.model_dump())


async def _start_stream(
    state: GatewayState, request: ApiRequest, formatter: Formatter, ticket: Ticket, media: MediaTicket
) -> EventStreamResponse:
    started = time.monotonic()
    events = _choice_events(state, request, stream=True)
    try:
        first = await anext(events)  # errors before the first token still get a proper status code
    except BaseException:
        await events.aclose()
        ticket.release()
        raise
    finally:
        media.release()
    state.metrics.record_ttft(time.monotonic() - started)
    state.metrics.record_request(200)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    body = _sse(state, request, formatter, first, events, started, ticket)
    return EventStreamResponse(body, headers=headers)


async def _sse(
    state: GatewayState,
    request: ApiRequest,
    formatter: Formatter,
    first: tuple[Generation, TokenEvent],
    events: AsyncIterator[tuple[Generation, TokenEvent]],
    started: float,
    ticket: Ticket,
) -> AsyncIterator[bytes]:
    rid, model = _request_id(formatter), request.model
    results = _results(request)
    last_token_at = time.monotonic()
    try:
        for generation in request.generations:
            opening = formatter.opening(rid, model, generation.index, generation.prompt_index)
            if opening is not None:
                if request.continuous_usage:  # nothing generated yet: the prompt's usage
                    prompt = ChoiceResult(0, 0, prompt_tokens=first[1].prompt_tokens, cached_tokens=first[1].cached_tokens)
                    opening.usage = usage_of([prompt])
                if request.return_token_ids:  # the prompt's ids on the choice's first chunk, as vLLM
                    opening.prompt_token_ids = list(first[1].prompt_token_ids)
                    results[generation.index].prompt_ids_sent = True
                yield _event(opening)
        item: tuple[Generation, TokenEvent] | None = first
        while item is not None:
            generation, event = item
            result = results[generation.index]
            delta = event.text[len(result.text) :]
            _accumulate(result, event)
            if delta or event.finished or event.logprobs:
                chunk = formatter.delta(rid, model, result, delta, len(event.logprobs))
                if request.continuous_usage:
                    chunk.usage = usage_of(list(results.values()))
                yield _event(chunk)
            item = await anext(events, None)
            if item is not None and item[1].token_ids:
                now = time.monotonic()
                state.metrics.record_tokens(now - last_token_at, len(item[1].token_ids))
                last_token_at = now
        state.metrics.record_e2e(time.monotonic() - started)
        usage = usage_of(list(results.values()))
        _record_finished(state, usage, list(results.values()))
        if request.include_usage:
            yield _event(formatter.usage_chunk(rid, model, usage))
        yield b"data: [DONE]\n\n"
    except GatewayError as exc:
        yield f"data: {json.dumps(exc.to_json())}\n\n".encode()
    except Exception as exc:  # a fault of the gateway's own: the stream still ends with an error event
        yield f"data: {json.dumps(unexpected_error(exc, 'streaming a response').to_json())}\n\n".encode()
    finally:
        ticket.release()
        await events.aclose()  # on disconnect too: stops the request's work on every node


def _choice_events(state: GatewayState, request: ApiRequest, *, stream: bool) -> AsyncIterator[tuple[Generation, TokenEvent]]:
    """Every choice's token events, interleaved as they come; a beam search's choices at its end."""
    if request.beam is None:
        return merged_events(lambda g: state.events(g, stream=stream), request.generations)
    return _beam_events(state, request)


async def _beam_events(state: GatewayState, request: ApiRequest) -> AsyncIterator[tuple[Generation, TokenEvent]]:
    pipeline = state.pipeline
    stop_ids = frozenset((await pipeline.model_info()).eos_token_ids)
    events = beam_events(request, lambda g: state.events(g, stream=False), pipeline.detokenize, stop_ids, pipeline.max_model_len)
    async for item in events:
        yield item


def _record_finished(state: GatewayState, usage: Usage, choices: list[ChoiceResult]) -> None:
    state.metrics.record_finished(usage.prompt_tokens, usage.completion_tokens, [c.finish_reason or "stop" for c in choices])


def _results(request: ApiRequest) -> dict[int, ChoiceResult]:
    return {
        g.index: ChoiceResult(index=g.index, prompt_index=g.prompt_index, logprobs=[] if g.sampling.logprobs is not None else None)
        for g in request.generations
    }


def _accumulate(result: ChoiceResult, event: TokenEvent) -> None:
    result.num_tokens += len(event.token_ids)
    result.token_ids += event.token_ids
    result.prompt_token_ids = event.prompt_token_ids
    result.text = max(result.text, event.text, key=len)
    result.prompt_tokens, result.cached_tokens = event.prompt_tokens, event.cached_tokens
    result.add_logprobs(event.logprobs)
    if result.prompt_logprobs is None:
        result.prompt_logprobs = event.prompt_logprobs
    if event.finished:
        result.finish_reason = event.finish_reason or "stop"


def _event(model: BaseModel) -> bytes:
    return b"data: " + model.model_dump_json().encode() + b"\n\n"


def _request_id(formatter: Formatter) -> str:
    return f"{formatter.id_prefix}-{uuid.uuid4().hex}"


# The HTTP response that carries a stream of server-sent events, stopped when the client goes.
#
# Why not Starlette's StreamingResponse: below ASGI spec 2.4 (uvicorn's httptools protocol declares
# 2.3) it runs every stream in an anyio task group, and a task group's cancellation is delivered
# again on every event-loop cycle until its tasks have ended: a cost per stream that shows at a
# thousand streams (docs/benchmarks.md, "The gateway's per-request costs").
#
# Here the events are written by one plain asyncio task while a second waits for the client's
# ``http.disconnect``. Whichever ends first decides: the stream ran out (the watcher is cancelled),
# or the client left (the writer is cancelled at its current await, which closes the event
# iterator and with it the request's work on every node). The same holds as in Starlette: nothing
# is written after a disconnect, and the response returns only once the writer has finished.
class EventStreamResponse(StreamingResponse):
    media_type = "text/event-stream"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        loop = asyncio.get_running_loop()
        writer = loop.create_task(self.stream_response(send))
        watcher = loop.create_task(_until_disconnect(receive))
        try:
            await asyncio.wait((writer, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            # The server shutting down cancels this task: both children go with it.
            watcher.cancel()
            writer.cancel()  # a no-op once the stream has run out
            await asyncio.wait((writer, watcher))
        error = None if writer.cancelled() else writer.exception()
        if error is None and not watcher.cancelled():
            error = watcher.exception()  # the server's receive failed: the stream was cut short
        if error is not None:
            raise error
        if self.background is not None:
            await self.background()


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
