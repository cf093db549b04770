"""The gateway's probes and read-only endpoints: /live, /ready, /health (Kubernetes' and a
person's view of whether it can route), /version and /metrics."""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations at runtime.
from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST

from services.gateway.config_agreement import DisagreementLog, block_size_disagreement
from services.gateway.protocol import HealthResponse, LiveResponse, NodeRecord, ReadyResponse
from services.gateway.state import GatewayState
from services.gateway.tokenize_protocol import VersionResponse
from services.router.membership import ROUTED_ROLES


def probe_routes(state: GatewayState, version: str) -> APIRouter:
    router = APIRouter()
    disagreements = DisagreementLog()

    def readiness() -> tuple[str, dict[str, int]]:
        membership = state.pipeline.membership
        role_to_count = {role: len(membership.nodes(role)) for role in ROUTED_ROLES}
        missing = [role for role, count in role_to_count.items() if not count]
        disagreement = block_size_disagreement(membership.snapshot().values(), state.pipeline.router.block_size)
        disagreements.note(disagreement)
        if state.draining:
            return "draining", role_to_count
        if disagreement is not None:
            return disagreement, role_to_count
        return ("ok" if not missing else f"no live {', '.join(missing)} node"), role_to_count

    @router.get("/live", response_model=LiveResponse)
    async def live() -> LiveResponse:
        """Kubernetes liveness: the process serves HTTP. Never about other tiers: a tier that is
        down must not get every gateway restarted."""
        return LiveResponse(status="draining" if state.draining else "ok")

    @router.get("/ready", response_model=ReadyResponse, responses={503: {"model": ReadyResponse}})
    async def ready() -> JSONResponse:
        """Kubernetes readiness: a node of every role to route to, and not draining."""
        status, role_to_count = readiness()
        body = ReadyResponse(status=status, num_nodes=role_to_count)
        return JSONResponse(body.model_dump(), status_code=200 if status == "ok" else 503)

    @router.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
    async def health() -> JSONResponse:
        """/ready's answer with the live nodes listed (role and id; addresses stay internal)."""
        status, _ = readiness()
        nodes = [NodeRecord(role=s.info.role, node_id=s.info.node_id) for s in state.pipeline.membership.snapshot().values()]
        body = HealthResponse(status=status, nodes=nodes)
        return JSONResponse(body.model_dump(), status_code=200 if status == "ok" else 503)

    @router.get("/version", response_model=VersionResponse)
    async def version_route() -> VersionResponse:
        return VersionResponse(version=version)

    @router.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(await state.render_metrics(), media_type=CONTENT_TYPE_LATEST)

    return router
