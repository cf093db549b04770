"""The OpenAI-compatible HTTP API: a FastAPI app over the Pipeline.

Routes: POST /v1/chat/completions (JSON, or server-sent events when ``stream``), GET /v1/models,
GET /health, GET /metrics, and FastAPI's /openapi.json and /docs. Every error, request
validation included, is OpenAI's error JSON.

A stream's status line waits for the first token, so failures before it (bad image, no live
node) get a real status code; later failures end the stream with an error event. The pipeline
is blocking gRPC, so each request's events are produced on a thread (event_bridge) and a client
that disconnects cancels its request's work on every node.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.gateway import openai_api
from services.gateway.body_limit import BodyLimitMiddleware
from services.gateway.errors import GatewayError
from services.gateway.event_bridge import iterate_in_thread
from services.gateway.metrics import GatewayMetrics, RoleCounters
from services.gateway.pipeline import Pipeline, TokenEvent
from services.gateway.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChunkDelta,
    ErrorResponse,
    HealthResponse,
    ModelCard,
    ModelList,
    NodeRecord,
)
from services.router.membership import ROUTED_ROLES

MAX_BODY_BYTES = 64 * 1024 * 1024
CHAT_PATH = "/v1/chat/completions"
_ERROR_RESPONSES = {status: {"model": ErrorResponse} for status in (400, 404, 413, 500, 503)}


@dataclass(slots=True)
class GatewayState:
    pipeline: Pipeline
    served_model: str
    default_max_tokens: int
    started: int
    metrics: GatewayMetrics = field(init=False)
    draining: bool = False
    num_in_flight: int = 0  # requests whose pipeline is running
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.metrics = GatewayMetrics(self.cluster_counters, lambda: float(self.num_in_flight))

    def cluster_counters(self) -> RoleCounters:
        """Every live node's counters (one Stats call each, so: blocking), and the gateway's own."""
        counters = {f"{role}@{address}": dict(s.counters) for role, address, s in self.pipeline.stats()}
        counters["gateway@self"] = {
            "gateway_node_failures_total": float(self.pipeline.num_retries),
            "gateway_migrations_total": float(self.pipeline.num_migrations),
        }
        return counters

    def events(self, chat: openai_api.ChatRequest, *, stream: bool) -> AsyncIterator[TokenEvent]:
        """The request's token events, produced on a thread of its own."""

        def counted() -> Iterator[TokenEvent]:
            with self._lock:
                self.num_in_flight += 1
            try:
                yield from self.pipeline.run(chat.preprocess_body, chat.sampling, cache_salt=chat.cache_salt, stream=stream)
            finally:
                with self._lock:
                    self.num_in_flight -= 1

        return iterate_in_thread(counted)


def create_app(
    pipeline: Pipeline, *, served_model: str, default_max_tokens: int, max_body_bytes: int = MAX_BODY_BYTES
) -> tuple[FastAPI, GatewayState]:
    state = GatewayState(pipeline, served_model, default_max_tokens, int(time.time()))
    app = FastAPI(title="Tessera", summary="OpenAI-compatible serving of vision-language models", version="0.1.0")
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=max_body_bytes, on_reject=lambda: state.metrics.record_request(413))
    _add_error_handlers(app, state)

    @app.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
    async def health() -> JSONResponse:
        membership = state.pipeline.membership
        missing = [role for role in ROUTED_ROLES if not membership.nodes(role)]
        nodes = [NodeRecord(role=s.info.role, address=s.info.grpc_address, node_id=s.info.node_id) for s in membership.snapshot().values()]
        status = "draining" if state.draining else ("ok" if not missing else f"no live {', '.join(missing)} node")
        body = HealthResponse(status=status, nodes=nodes)
        return JSONResponse(body.model_dump(), status_code=200 if status == "ok" else 503)

    @app.get("/v1/models", response_model=ModelList)
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=state.served_model, created=state.started)])

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> PlainTextResponse:  # a plain def: Stats calls block, so FastAPI runs it on a worker thread
        return PlainTextResponse(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.post(
        CHAT_PATH,
        response_model=ChatCompletionResponse,
        responses={**_ERROR_RESPONSES, 200: {"content": {"text/event-stream": {}}, "description": "a stream of chunks when stream=true"}},
    )
    async def chat_completions(request: ChatCompletionRequest):
        if state.draining:
            raise GatewayError(503, "the gateway is draining; retry on another gateway")
        chat = openai_api.to_chat_request(request, served_model=state.served_model, default_max_tokens=state.default_max_tokens)
        return await (_start_stream(state, chat) if chat.stream else _complete(state, chat))

    return app, state


async def _complete(state: GatewayState, chat: openai_api.ChatRequest) -> JSONResponse:
    started = time.monotonic()
    final: TokenEvent | None = None
    num_completion_tokens = 0
    async for event in state.events(chat, stream=False):
        if final is None:
            state.metrics.record_ttft(time.monotonic() - started)
        num_completion_tokens += len(event.token_ids)
        final = event
    assert final is not None, "the pipeline ends every request with a finished event"
    state.metrics.record_e2e(time.monotonic() - started)
    usage = openai_api.usage(final.prompt_tokens, num_completion_tokens, final.cached_tokens)
    body = openai_api.completion(_request_id(), state.served_model, final.text, final.finish_reason or "stop", usage)
    state.metrics.record_request(200)
    return JSONResponse(body.model_dump())


async def _start_stream(state: GatewayState, chat: openai_api.ChatRequest) -> StreamingResponse:
    started = time.monotonic()
    events = state.events(chat, stream=True)
    try:
        first = await anext(events)  # errors before the first token still get a proper status code
    except BaseException:
        await events.aclose()
        raise
    state.metrics.record_ttft(time.monotonic() - started)
    state.metrics.record_request(200)
    timing = _StreamTiming(started, time.monotonic())
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(_sse(state, chat, first, events, timing), media_type="text/event-stream", headers=headers)


@dataclass(slots=True)
class _StreamTiming:
    arrived: float
    last_token: float


async def _sse(
    state: GatewayState, chat: openai_api.ChatRequest, first: TokenEvent, events: AsyncIterator[TokenEvent], timing: _StreamTiming
):
    """The stream's events. Text deltas are cut from each event's full text, so a token that
    completes a multi-byte character is sent once, whole."""
    rid, model = _request_id(), state.served_model
    sent_text, num_completion_tokens, last = "", 0, first
    try:
        yield _event(openai_api.chunk(rid, model, delta=ChunkDelta(role="assistant", content="")))
        event: TokenEvent | None = first
        while event is not None:
            num_completion_tokens += len(event.token_ids)
            # Released text only grows (the engine holds back stop-string prefixes and split
            # characters), so the delta is the new tail; never resend what was sent.
            delta = event.text[len(sent_text) :]
            sent_text, last = max(sent_text, event.text, key=len), event
            if delta or event.finished:
                finish_reason = event.finish_reason if event.finished else None
                yield _event(openai_api.chunk(rid, model, delta=ChunkDelta(content=delta or None), finish_reason=finish_reason))
            event = await anext(events, None)
            if event is not None and event.token_ids:
                now = time.monotonic()
                state.metrics.record_tokens(now - timing.last_token, len(event.token_ids))
                timing.last_token = now
        state.metrics.record_e2e(time.monotonic() - timing.arrived)
        if chat.include_usage:
            usage = openai_api.usage(last.prompt_tokens, num_completion_tokens, last.cached_tokens)
            yield _event(openai_api.chunk(rid, model, delta=None, usage=usage))
        yield b"data: [DONE]\n\n"
    except GatewayError as exc:
        yield _event_json(exc.to_json())
    finally:
        await events.aclose()  # on disconnect too: stops the request's work on every node


def _add_error_handlers(app: FastAPI, state: GatewayState) -> None:
    def respond(exc: GatewayError, request: Request) -> JSONResponse:
        if request.url.path == CHAT_PATH:
            state.metrics.record_request(exc.status)
        return JSONResponse(exc.to_json(), status_code=exc.status)

    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        return respond(exc, request)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return respond(openai_api.validation_error(exc.errors()), request)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = f"no route for {request.method} {request.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
        return respond(GatewayError(exc.status_code, message), request)


def _event(model) -> bytes:
    return b"data: " + model.model_dump_json().encode() + b"\n\n"


def _event_json(payload: dict) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def _request_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"
