"""The gateway's probes and read-only endpoints: /live, /ready, /health (Kubernetes' and a
person's view of whether it can route), /version and /metrics."""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations at runtime.
import logging
import time
from collections.abc import Iterable

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST

from services.gateway.protocol.responses import HealthResponse, LiveResponse, NodeRecord, ReadyResponse
from services.gateway.protocol.tokens import VersionResponse
from services.gateway.state import GatewayState
from shared.index.types import NodeState

PROBE_REFRESH_S = 0.1


def probe_routes(state: GatewayState, version: str) -> APIRouter:
    router = APIRouter()
    disagreements = DisagreementLog()
    last_refresh = [float("-inf")]

    async def readiness() -> tuple[str, dict[str, int]]:
        """Probed while a role has no node (starting up, or after a loss), the membership is
        listed again at once rather than at its next refresh, so readiness is reported as soon
        as the nodes register; at most every PROBE_REFRESH_S, whatever the probes' rate."""
        membership, roles = state.pipeline.membership, state.config.routed_roles
        now = time.monotonic()
        if any(not membership.nodes(role) for role in roles) and now - last_refresh[0] >= PROBE_REFRESH_S:
            last_refresh[0] = now
            await membership.refresh()
        role_to_count = {role: len(membership.nodes(role)) for role in roles}
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
        status, role_to_count = await readiness()
        body = ReadyResponse(status=status, num_nodes=role_to_count)
        return JSONResponse(body.model_dump(), status_code=200 if status == "ok" else 503)

    @router.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
    async def health() -> JSONResponse:
        """/ready's answer with the live nodes listed (role and id; addresses stay internal)."""
        status, _ = await readiness()
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


# The gateway's side of config agreement (shared/index/cluster_config.py): it registers no
# record, so no registration can refuse it, yet its ``block_size`` is what preprocess cuts every
# prompt's block hashes with and what the router looks up. A gateway that disagrees with the
# cluster's nodes would silently miss every prefix, so it reports itself not ready, naming both
# values, and a load balancer sends it nothing until it is restarted with the cluster's value.
log = logging.getLogger("tessera")


def block_size_disagreement(nodes: Iterable[NodeState], block_size: int) -> str | None:
    """Why this gateway must not serve these nodes, or None when they agree."""
    cluster = sorted({s.info.config.block_size for s in nodes if s.info.config.block_size is not None})
    if not cluster or cluster == [block_size]:
        return None
    values = ", ".join(str(v) for v in cluster)
    return f"this gateway's block_size {block_size} is not the cluster's ({values}): restart it with --block-size {cluster[0]}"


class DisagreementLog:
    """Logs a disagreement when it starts or changes, not at every probe."""

    def __init__(self) -> None:
        self._last: str | None = None

    def note(self, message: str | None) -> None:
        if message is not None and message != self._last:
            log.error("%s", message)
        self._last = message
