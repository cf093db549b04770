"""The OpenAI-compatible HTTP API: a FastAPI app over the Pipeline.

Routes: the API (api_routes.py: POST /v1/chat/completions and /v1/completions, JSON or server-sent
events when ``stream``, POST /tokenize and /detokenize, GET /v1/models; embedding_routes.py:
POST /v1/embeddings and /v1/score), the probes
(probe_routes.py: GET /version, /live, /ready, /health and /metrics), and FastAPI's /openapi.json
and /docs. Every error, request validation included, is OpenAI's error JSON. Every handler is a coroutine on the
one event loop the pipeline's grpc.aio calls run on; a client that disconnects cancels its
request's task, and with it the request's work on every node.
"""

from __future__ import annotations

import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette._utils import get_route_path
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.gateway.errors import GatewayError
from services.gateway.frontend.adapter_updates import AdapterUpdates, runtime_updates_allowed
from services.gateway.frontend.config import FrontendConfig
from services.gateway.frontend.frontend import Frontend
from services.gateway.frontend.tenants import ApiKeys
from services.gateway.http.api_routes import api_router
from services.gateway.http.body_limit import BodyLimitMiddleware
from services.gateway.http.embedding_routes import embedding_router
from services.gateway.http.lora_routes import lora_router
from services.gateway.http.probe_routes import probe_routes
from services.gateway.http.unexpected_errors import UnexpectedErrorMiddleware
from services.gateway.pipeline.pipeline import Pipeline
from services.gateway.protocol.validation_errors import validation_error
from services.gateway.state import GatewayState
from shared.version import tessera_version

TESSERA_VERSION = tessera_version()
# Counted in tessera_requests_total.
API_PATHS = ("/v1/chat/completions", "/v1/chat/completions/batch", "/v1/completions", "/v1/embeddings", "/v1/score", "/score")


def create_app(pipeline: Pipeline, config: FrontendConfig, *, api_keys: ApiKeys | None = None) -> tuple[FastAPI, Frontend]:
    """The app and the Frontend it serves from (gRPC Generate is built on the same one): its
    probes (probe_routes.py) and its API (api_routes.py), behind the body limit and OpenAI-shaped
    errors (a fault of its own too: unexpected_errors.py). ``config.root_path``: vLLM's
    --root-path, the prefix a path-routing proxy serves the API under; the routes answer with and
    without it, as vLLM's."""
    frontend = Frontend(GatewayState(pipeline, config, int(time.time())))
    state = frontend.state
    app = FastAPI(title="Tessera", summary="OpenAI-compatible serving of vision-language models", version=TESSERA_VERSION)
    app.state.frontend, app.state.api_keys = frontend, api_keys  # what the API's handlers depend on (api_routes.py)
    if config.root_path:
        app.add_middleware(RootPathMiddleware, root_path=config.root_path)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=config.max_body_bytes, on_reject=lambda: state.metrics.record_request(413))
    _add_error_handlers(app, state)
    # Added last, so outermost of ours: a fault anywhere below is a 500 on a connection that stays usable.
    app.add_middleware(UnexpectedErrorMiddleware, on_error=lambda scope: _count_api_request(state, scope, 500))
    app.include_router(probe_routes(state, TESSERA_VERSION))
    app.include_router(api_router)
    app.include_router(embedding_router)
    if runtime_updates_allowed():  # vLLM's switch for its runtime LoRA endpoints
        app.include_router(lora_router)
    if config.adapters.enabled:  # a node that lacks a request's adapter (it restarted since a runtime load) gets it
        pipeline.adapter_loads.loader = AdapterUpdates.for_pipeline(config.adapters, pipeline).load_on
    return app, frontend


class RootPathMiddleware:
    """Gives every request the API's ``root_path``. Starlette routes a path under it as the path
    without it, and any other path as it is, so both spellings reach the routes (as vLLM's
    --root-path does); uvicorn's own root_path would prefix every path instead."""

    def __init__(self, app, root_path: str) -> None:
        self.app, self.root_path = app, root_path

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] in ("http", "websocket"):
            scope = {**scope, "root_path": self.root_path}
        await self.app(scope, receive, send)


def _count_api_request(state: GatewayState, scope, status: int) -> None:
    if get_route_path(scope) in API_PATHS:
        state.metrics.record_request(status)


def _add_error_handlers(app: FastAPI, state: GatewayState) -> None:
    def respond_with(exc: GatewayError, request: Request) -> JSONResponse:
        _count_api_request(state, request.scope, exc.status)
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
