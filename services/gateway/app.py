"""The OpenAI-compatible HTTP API: a FastAPI app over the Pipeline.

Routes: POST /v1/chat/completions and /v1/completions (JSON, or server-sent events when
``stream``), POST /tokenize and /detokenize, GET /v1/models, /version, /live, /ready, /health and
/metrics, and FastAPI's /openapi.json and /docs. Every
error, request validation included, is OpenAI's error JSON. Every handler is a coroutine on the
one event loop the pipeline's grpc.aio calls run on; a client that disconnects cancels its
request's task, and with it the request's work on every node.
"""

# No `from __future__ import annotations` here: FastAPI reads the routes' annotations at runtime,
# and the dependency they name (``tenant``) is a local of create_app, invisible to string lookups.
import time
from typing import Annotated

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.gateway import openai_api
from services.gateway.admission import Admission
from services.gateway.body_limit import BodyLimitMiddleware
from services.gateway.completion_protocol import CompletionRequest, CompletionResponse
from services.gateway.config_agreement import DisagreementLog, block_size_disagreement
from services.gateway.errors import GatewayError
from services.gateway.formatters import ChatFormatter, CompletionFormatter
from services.gateway.ignored_fields import report_ignored_fields
from services.gateway.pipeline import Pipeline
from services.gateway.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ErrorResponse,
    HealthResponse,
    LiveResponse,
    ModelCard,
    ModelList,
    NodeRecord,
    ReadyResponse,
)
from services.gateway.responses import respond
from services.gateway.state import GatewayState
from services.gateway.tenants import ApiKeys, Tenant
from services.gateway.tokenize_protocol import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse, VersionResponse
from services.gateway.validation_errors import validation_error
from services.models.sampling_defaults import NO_DEFAULTS, SamplingDefaults
from services.router.membership import ROUTED_ROLES
from services.transport.api_key_auth import bearer_token
from shared.version import tessera_version

MAX_BODY_BYTES = 64 * 1024 * 1024
TESSERA_VERSION = tessera_version()
API_PATHS = ("/v1/chat/completions", "/v1/completions")  # counted in tessera_requests_total
_STREAM = {"content": {"text/event-stream": {}}, "description": "the response, or a stream of chunks when stream=true"}
_RESPONSES = {200: _STREAM, **{status: {"model": ErrorResponse} for status in (400, 401, 404, 413, 429, 500, 503)}}


def create_app(
    pipeline: Pipeline,
    *,
    served_names: tuple[str, ...],
    default_max_tokens: int,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_num_requests: int = 2048,
    api_keys: ApiKeys | None = None,
    model_root: str | None = None,
    tool_parser: str | None = None,
    sampling_defaults: SamplingDefaults = NO_DEFAULTS,
) -> tuple[FastAPI, GatewayState]:
    """``model_root``: what ``--model`` named (a built-in, a path), for /v1/models' ``root``;
    ``tool_parser``: the model family's tool-call parser, if it has one (tool_calls.py);
    ``sampling_defaults``: the checkpoint's generation-config defaults (sampling_defaults.py)."""
    if not served_names:
        raise ValueError("the gateway needs at least one served model name")
    state = GatewayState(pipeline, served_names, default_max_tokens, int(time.time()))
    max_model_len = pipeline.max_model_len
    admission = Admission(max_num_requests)

    async def tenant(authorization: Annotated[str | None, Header(include_in_schema=False)] = None) -> Tenant | None:
        """The caller's tenant; every /v1 route depends on it. None when keys are off. Async only
        so that FastAPI calls it on the event loop: a plain function would cost every request a
        trip through a worker thread."""
        if api_keys is None:
            return None
        key = bearer_token(authorization)
        found = api_keys.tenant_for(key) if key is not None else None
        if found is None:
            message = "a valid API key is required: send 'Authorization: Bearer <key>'" if key is None else "the API key is not valid"
            raise GatewayError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        return found

    app = FastAPI(title="Tessera", summary="OpenAI-compatible serving of vision-language models", version=TESSERA_VERSION)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=max_body_bytes, on_reject=lambda: state.metrics.record_request(413))
    _add_error_handlers(app, state)

    disagreements = DisagreementLog()

    def readiness() -> tuple[str, dict[str, int]]:
        membership = state.pipeline.membership
        role_to_count = {role: len(membership.nodes(role)) for role in ROUTED_ROLES}
        missing = [role for role, count in role_to_count.items() if not count]
        disagreement = block_size_disagreement(membership.snapshot().values(), state.pipeline.router.block_size)
        disagreements.note(disagreement)
        if state.draining:
            status = "draining"
        elif disagreement is not None:
            status = disagreement
        else:
            status = "ok" if not missing else f"no live {', '.join(missing)} node"
        return status, role_to_count

    @app.get("/live", response_model=LiveResponse)
    async def live() -> LiveResponse:
        """Kubernetes liveness: the process serves HTTP. Never about other tiers: a tier that is
        down must not get every gateway restarted."""
        return LiveResponse(status="draining" if state.draining else "ok")

    @app.get("/ready", response_model=ReadyResponse, responses={503: {"model": ReadyResponse}})
    async def ready() -> JSONResponse:
        """Kubernetes readiness: a node of every role to route to, and not draining."""
        status, role_to_count = readiness()
        body = ReadyResponse(status=status, num_nodes=role_to_count)
        return JSONResponse(body.model_dump(), status_code=200 if status == "ok" else 503)

    @app.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
    async def health() -> JSONResponse:
        """/ready's answer with the live nodes listed (role and id; addresses stay internal)."""
        status, _ = readiness()
        nodes = [NodeRecord(role=s.info.role, node_id=s.info.node_id) for s in state.pipeline.membership.snapshot().values()]
        body = HealthResponse(status=status, nodes=nodes)
        return JSONResponse(body.model_dump(), status_code=200 if status == "ok" else 503)

    @app.get("/v1/models", response_model=ModelList, dependencies=[Depends(tenant)])
    async def models() -> ModelList:
        root = model_root or state.served_names[0]
        return ModelList(
            data=[ModelCard(id=name, created=state.started, root=root, max_model_len=max_model_len) for name in state.served_names]
        )

    @app.get("/version", response_model=VersionResponse)
    async def version() -> VersionResponse:
        return VersionResponse(version=TESSERA_VERSION)

    @app.post("/tokenize", response_model=TokenizeResponse, responses=_RESPONSES, dependencies=[Depends(tenant)])
    async def tokenize(request: TokenizeRequest) -> TokenizeResponse:
        report_ignored_fields(request, "/tokenize")
        openai_api.check_model(request.model, state.served_names)
        tokens = list((await state.pipeline.tokenize(request.prompt_input())).prompt_token_ids)
        return TokenizeResponse(count=len(tokens), max_model_len=max_model_len, tokens=tokens)

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=_RESPONSES, dependencies=[Depends(tenant)])
    async def detokenize(request: DetokenizeRequest) -> DetokenizeResponse:
        report_ignored_fields(request, "/detokenize")
        openai_api.check_model(request.model, state.served_names)
        return DetokenizeResponse(prompt=await state.pipeline.detokenize(request.tokens))

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(await state.render_metrics(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=_RESPONSES)
    async def chat_completions(request: ChatCompletionRequest, caller: Annotated[Tenant | None, Depends(tenant)]):
        _refuse_if_draining(state)
        ignored = report_ignored_fields(request, "/v1/chat/completions")
        api_request = openai_api.to_chat_request(
            request,
            served_names=state.served_names,
            default_max_tokens=state.default_max_tokens,
            tenant=caller,
            tool_parser=tool_parser,
            sampling_defaults=sampling_defaults,
        )
        formatter = ChatFormatter(api_request.tool_mode)
        response = await respond(state, api_request, formatter, admission.admit(len(api_request.generations)))
        response.headers.update(ignored)
        return response

    @app.post("/v1/completions", response_model=CompletionResponse, responses=_RESPONSES)
    async def completions(request: CompletionRequest, caller: Annotated[Tenant | None, Depends(tenant)]):
        _refuse_if_draining(state)
        ignored = report_ignored_fields(request, "/v1/completions")
        api_request = openai_api.to_completion_request(
            request, served_names=state.served_names, tenant=caller, sampling_defaults=sampling_defaults
        )
        response = await respond(state, api_request, CompletionFormatter(), admission.admit(len(api_request.generations)))
        response.headers.update(ignored)
        return response

    return app, state


def _refuse_if_draining(state: GatewayState) -> None:
    if state.draining:
        raise GatewayError(503, "the gateway is draining; retry on another gateway")


def _add_error_handlers(app: FastAPI, state: GatewayState) -> None:
    def respond_with(exc: GatewayError, request: Request) -> JSONResponse:
        if request.url.path in API_PATHS:
            state.metrics.record_request(exc.status)
        return JSONResponse(exc.to_json(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        return respond_with(exc, request)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return respond_with(validation_error(exc.errors()), request)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = f"no route for {request.method} {request.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
        return respond_with(GatewayError(exc.status_code, message), request)
