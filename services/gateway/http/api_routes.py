"""The gateway's OpenAI-compatible routes: /v1/chat/completions and /v1/completions (JSON, or
server-sent events when ``stream``), vLLM's /v1/chat/completions/batch (batch_chat.py),
/v1/models, /tokenize and /detokenize. Every one depends on
the caller's tenant (``tenant_of``: API keys, when they are on)."""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations at runtime, and
# the dependency they name (``tenant``) is a local, invisible to string lookups.
from dataclasses import replace
from typing import Annotated

from fastapi import APIRouter, Depends, Header

from services.gateway.errors import GatewayError
from services.gateway.frontend import openai_api
from services.gateway.frontend.frontend import Frontend, ServedModel
from services.gateway.frontend.openai_api import ignored_header, report_ignored_fields
from services.gateway.frontend.tenants import ApiKeys, Tenant
from services.gateway.http.responses import respond
from services.gateway.output.formatters import ChatFormatter, CompletionFormatter, Formatter
from services.gateway.protocol.batch_chat import BatchChatCompletionRequest, to_batch_chat_request
from services.gateway.protocol.chat import ChatCompletionRequest
from services.gateway.protocol.completion import CompletionRequest, CompletionResponse
from services.gateway.protocol.responses import ChatCompletionResponse, ErrorResponse, ModelCard, ModelList
from services.gateway.protocol.tokens import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from services.gateway.state import GatewayState
from services.transport.api_key_auth import bearer_token

_STREAM = {"content": {"text/event-stream": {}}, "description": "the response, or a stream of chunks when stream=true"}
RESPONSES = {200: _STREAM, **{status: {"model": ErrorResponse} for status in (400, 401, 404, 413, 429, 500, 503)}}


def tenant_of(api_keys: ApiKeys | None):
    """The dependency naming a request's tenant; None when keys are off. Async only so that
    FastAPI calls it on the event loop: a plain function would cost every request a trip through
    a worker thread."""

    async def tenant(authorization: Annotated[str | None, Header(include_in_schema=False)] = None) -> Tenant | None:
        if api_keys is None:
            return None
        key = bearer_token(authorization)
        found = api_keys.tenant_for(key) if key is not None else None
        if found is None:
            message = "a valid API key is required: send 'Authorization: Bearer <key>'" if key is None else "the API key is not valid"
            raise GatewayError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        return found

    return tenant


def api_routes(frontend: Frontend, tenant) -> APIRouter:
    router = APIRouter()
    state, model = frontend.state, frontend.model
    _info_routes(router, state, model, tenant)

    @router.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=RESPONSES)
    async def chat_completions(request: ChatCompletionRequest, caller: Annotated[Tenant | None, Depends(tenant)]):
        frontend.check_open()
        ignored = report_ignored_fields(request, "/v1/chat/completions")
        api_request = openai_api.to_chat_request(
            request,
            served_names=state.served_names,
            default_max_tokens=state.default_max_tokens,
            tenant=caller,
            tool_parser=model.tool_parser,
            sampling_defaults=model.sampling_defaults,
            limits=await frontend.limits(request.top_logprobs, request.prompt_logprobs),
        )
        formatter = ChatFormatter(api_request.tool_mode, api_request.echo, api_request.return_token_ids, api_request.tokens_as_ids)
        return await _serve(frontend, api_request, formatter, ignored)

    @router.post("/v1/chat/completions/batch", response_model=ChatCompletionResponse, responses=RESPONSES)
    async def batch_chat_completions(request: BatchChatCompletionRequest, caller: Annotated[Tenant | None, Depends(tenant)]):
        frontend.check_open()
        api_request, echoes, names = to_batch_chat_request(
            request,
            served_names=state.served_names,
            default_max_tokens=state.default_max_tokens,
            tenant=caller,
            sampling_defaults=model.sampling_defaults,
            limits=await frontend.limits(*((request.model_extra or {}).get(name) for name in ("top_logprobs", "prompt_logprobs"))),
        )
        formatter = ChatFormatter(None, echoes, api_request.return_token_ids, api_request.tokens_as_ids)
        return await _serve(frontend, api_request, formatter, ignored_header(names, "/v1/chat/completions/batch"))

    @router.post("/v1/completions", response_model=CompletionResponse, responses=RESPONSES)
    async def completions(request: CompletionRequest, caller: Annotated[Tenant | None, Depends(tenant)]):
        frontend.check_open()
        ignored = report_ignored_fields(request, "/v1/completions")
        api_request = openai_api.to_completion_request(
            request,
            served_names=state.served_names,
            tenant=caller,
            sampling_defaults=model.sampling_defaults,
            limits=await frontend.limits(request.logprobs, request.prompt_logprobs),
        )
        echoes = [p if isinstance(p, str) else await state.pipeline.detokenize(p) for p in request.prompts()] if request.echo else []
        formatter = CompletionFormatter(
            api_request.return_token_ids, echoes, echo_only=request.echo_only, tokens_as_ids=api_request.tokens_as_ids
        )
        return await _serve(frontend, api_request, formatter, ignored)

    return router


def _info_routes(router: APIRouter, state: GatewayState, model: ServedModel, tenant) -> None:
    """/v1/models, /tokenize and /detokenize."""
    max_model_len = state.pipeline.max_model_len

    @router.get("/v1/models", response_model=ModelList, dependencies=[Depends(tenant)])
    async def models() -> ModelList:
        root = model.model_root or state.served_names[0]
        cards = [ModelCard(id=name, created=state.started, root=root, max_model_len=max_model_len) for name in state.served_names]
        return ModelList(data=cards)

    @router.post("/tokenize", response_model=TokenizeResponse, responses=RESPONSES, dependencies=[Depends(tenant)])
    async def tokenize(request: TokenizeRequest) -> TokenizeResponse:
        report_ignored_fields(request, "/tokenize")
        openai_api.check_model(request.model, state.served_names)
        tokens = list((await state.pipeline.tokenize(request.prompt_input())).prompt_token_ids)
        return TokenizeResponse(count=len(tokens), max_model_len=max_model_len, tokens=tokens)

    @router.post("/detokenize", response_model=DetokenizeResponse, responses=RESPONSES, dependencies=[Depends(tenant)])
    async def detokenize(request: DetokenizeRequest) -> DetokenizeResponse:
        report_ignored_fields(request, "/detokenize")
        openai_api.check_model(request.model, state.served_names)
        return DetokenizeResponse(prompt=await state.pipeline.detokenize(request.tokens))


async def _serve(frontend: Frontend, request: openai_api.ApiRequest, formatter: Formatter, ignored: dict[str, str]):
    """Admit the request and its media, run it, and answer (with the ignored-fields header)."""
    request = _forced_usage(frontend.state, request)
    admitted = await frontend.admit(request.generations)
    response = await respond(frontend.state, request, formatter, admitted.ticket, admitted.media)
    response.headers.update(ignored)
    return response


def _forced_usage(state: GatewayState, request: openai_api.ApiRequest) -> openai_api.ApiRequest:
    """With --enable-force-include-usage, a stream reports its usage on every chunk."""
    if not state.force_include_usage or not request.stream:
        return request
    return replace(request, include_usage=True, continuous_usage=True)
