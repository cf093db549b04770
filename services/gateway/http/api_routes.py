"""The gateway's OpenAI-compatible routes: /v1/chat/completions and /v1/completions (JSON, or
server-sent events when ``stream``), vLLM's /v1/chat/completions/batch, /v1/models, /tokenize
and /detokenize. Each handler is a plain function over the app's Frontend (its guards and
conversions: services/gateway/frontend/) and the caller's tenant (API keys, when they are on),
both FastAPI dependencies read from the app (create_app sets them)."""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations at runtime.
from dataclasses import replace
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request

from services.gateway.errors import GatewayError
from services.gateway.frontend.frontend import Frontend
from services.gateway.frontend.openai_api import ApiRequest, check_model, ignored_header, report_ignored_fields
from services.gateway.frontend.tenants import Tenant
from services.gateway.http.responses import respond
from services.gateway.output.formatters import ChatFormatter, CompletionFormatter, Formatter
from services.gateway.protocol.batch_chat import BatchChatCompletionRequest
from services.gateway.protocol.chat import ChatCompletionRequest
from services.gateway.protocol.completion import CompletionRequest, CompletionResponse
from services.gateway.protocol.responses import ChatCompletionResponse, ErrorResponse, ModelCard, ModelList
from services.gateway.protocol.tokens import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from services.transport.api_key_auth import bearer_token

_STREAM = {"content": {"text/event-stream": {}}, "description": "the response, or a stream of chunks when stream=true"}
RESPONSES = {200: _STREAM, **{status: {"model": ErrorResponse} for status in (400, 401, 404, 413, 429, 500, 503)}}


def frontend_of(request: Request) -> Frontend:
    return request.app.state.frontend


async def caller_of(request: Request, authorization: Annotated[str | None, Header(include_in_schema=False)] = None) -> Tenant | None:
    """The request's tenant; None when keys are off. Async only so that FastAPI calls it on the
    event loop: a plain function would cost every request a trip through a worker thread."""
    api_keys = request.app.state.api_keys
    if api_keys is None:
        return None
    key = bearer_token(authorization)
    found = api_keys.tenant_for(key) if key is not None else None
    if found is None:
        message = "a valid API key is required: send 'Authorization: Bearer <key>'" if key is None else "the API key is not valid"
        raise GatewayError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
    return found


FrontendDep = Annotated[Frontend, Depends(frontend_of)]
CallerDep = Annotated[Tenant | None, Depends(caller_of)]
api_router = APIRouter()


@api_router.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=RESPONSES)
async def chat_completions(request: ChatCompletionRequest, frontend: FrontendDep, caller: CallerDep):
    frontend.check_serves("chat")
    frontend.check_open()
    ignored = report_ignored_fields(request, "/v1/chat/completions")
    api_request = await frontend.chat(request, caller)
    formatter = ChatFormatter(api_request.tool_mode, api_request.echo, api_request.return_token_ids, api_request.tokens_as_ids)
    return await serve(frontend, api_request, formatter, ignored)


@api_router.post("/v1/chat/completions/batch", response_model=ChatCompletionResponse, responses=RESPONSES)
async def batch_chat_completions(request: BatchChatCompletionRequest, frontend: FrontendDep, caller: CallerDep):
    frontend.check_serves("chat")
    frontend.check_open()
    api_request, echoes, names = await frontend.batch_chat(request, caller)
    formatter = ChatFormatter(None, echoes, api_request.return_token_ids, api_request.tokens_as_ids)
    return await serve(frontend, api_request, formatter, ignored_header(names, "/v1/chat/completions/batch"))


@api_router.post("/v1/completions", response_model=CompletionResponse, responses=RESPONSES)
async def completions(request: CompletionRequest, frontend: FrontendDep, caller: CallerDep):
    frontend.check_serves("completions")
    frontend.check_open()
    ignored = report_ignored_fields(request, "/v1/completions")
    api_request = await frontend.completion(request, caller)
    pipeline = frontend.state.pipeline
    echoes = [p if isinstance(p, str) else await pipeline.detokenize(p) for p in request.prompts()] if request.echo else []
    formatter = CompletionFormatter(
        api_request.return_token_ids, echoes, echo_only=request.echo_only, tokens_as_ids=api_request.tokens_as_ids
    )
    return await serve(frontend, api_request, formatter, ignored)


@api_router.get("/v1/models", response_model=ModelList, dependencies=[Depends(caller_of)])
async def models(frontend: FrontendDep) -> ModelList:
    state, config = frontend.state, frontend.config
    root = config.model.model_root or config.served_names[0]
    max_model_len = state.pipeline.max_model_len
    cards = [ModelCard(id=name, created=state.started, root=root, max_model_len=max_model_len) for name in config.served_names]
    # LoRA adapters as vLLM lists them: the adapter's path as its root, the model it adapts as its parent.
    for served in config.adapters:
        parent = served.parent or config.served_names[0]
        cards.append(
            ModelCard(id=served.ref.name, created=state.started, root=str(served.path), parent=parent, max_model_len=max_model_len)
        )
    return ModelList(data=cards)


@api_router.post("/tokenize", response_model=TokenizeResponse, responses=RESPONSES, dependencies=[Depends(caller_of)])
async def tokenize(request: TokenizeRequest, frontend: FrontendDep) -> TokenizeResponse:
    report_ignored_fields(request, "/tokenize")
    check_model(request.model, frontend.config.served_names, frontend.config.adapters)
    tokens = await frontend.tokenize(request.prompt_input())
    return TokenizeResponse(count=len(tokens), max_model_len=frontend.state.pipeline.max_model_len, tokens=tokens)


@api_router.post("/detokenize", response_model=DetokenizeResponse, responses=RESPONSES, dependencies=[Depends(caller_of)])
async def detokenize(request: DetokenizeRequest, frontend: FrontendDep) -> DetokenizeResponse:
    report_ignored_fields(request, "/detokenize")
    check_model(request.model, frontend.config.served_names, frontend.config.adapters)
    return DetokenizeResponse(prompt=await frontend.state.pipeline.detokenize(request.tokens))


async def serve(frontend: Frontend, request: ApiRequest, formatter: Formatter, ignored: dict[str, str]):
    """Admit the request and its media, run it, and answer (with the ignored-fields header)."""
    if frontend.config.force_include_usage and request.stream:  # vLLM's flag: usage on every chunk
        request = replace(request, include_usage=True, continuous_usage=True)
    admitted = await frontend.admit(request.generations)
    response = await respond(frontend.state, request, formatter, admitted.ticket, admitted.media)
    response.headers.update(ignored)
    return response
