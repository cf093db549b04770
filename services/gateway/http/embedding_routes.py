"""The pooling routes: POST /v1/embeddings and /v1/score (also /score, as vLLM serves it). Plain
handlers over the Frontend (services/gateway/frontend/embeddings.py owns the steps); a gateway
whose runner does not serve them answers 404, as vLLM's (Frontend.check_serves)."""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations at runtime.
from fastapi import APIRouter

from services.gateway.frontend import embeddings as pooled
from services.gateway.frontend.openai_api import report_ignored_fields
from services.gateway.http.api_routes import RESPONSES, CallerDep, FrontendDep
from services.gateway.protocol.embeddings import EmbeddingRequest, EmbeddingResponse, ScoreRequest, ScoreResponse

embedding_router = APIRouter()
ERRORS = {status: spec for status, spec in RESPONSES.items() if status != 200}


@embedding_router.post("/v1/embeddings", response_model=EmbeddingResponse, responses=ERRORS)
async def create_embeddings(request: EmbeddingRequest, frontend: FrontendDep, caller: CallerDep) -> EmbeddingResponse:
    report_ignored_fields(request, "/v1/embeddings")
    return await pooled.embeddings(frontend, request, caller)


@embedding_router.post("/v1/score", response_model=ScoreResponse, responses=ERRORS)
@embedding_router.post("/score", response_model=ScoreResponse, responses=ERRORS, include_in_schema=False)
async def create_score(request: ScoreRequest, frontend: FrontendDep, caller: CallerDep) -> ScoreResponse:
    report_ignored_fields(request, "/v1/score")
    return await pooled.score(frontend, request, caller)
