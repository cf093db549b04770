"""``tessera serve --role decode``."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from services.engine.config import EngineConfig
from services.engine.step_pacing import step_pacing
from services.models.registry import ModelRef
from services.transport.node_admission import NodeAdmission
from services.transport.node_runtime import NodeSettings, node_addresses, node_auth, node_lifecycle, node_publisher
from shared import host_backlog
from shared.liveness import Liveness

log = logging.getLogger("tessera.decode")


@dataclass(frozen=True, slots=True)
class Settings(NodeSettings):
    pass


def main(settings: Settings, model: ModelRef, engine_config: EngineConfig, preprocess_config) -> None:
    from services.decode.node import DecodeNode
    from services.decode.server import serve

    liveness = Liveness(stall_s=settings.liveness_stall_s)
    admission = NodeAdmission("decode", settings.max_pending_requests)
    auth, channel_auth = node_auth(settings)
    addresses = node_addresses(settings)
    pacing = step_pacing(
        host_backlog.board_from_env(),
        yield_step_ms=engine_config.yield_step_ms,
        yield_max_step_ms=engine_config.yield_max_step_ms,
        yield_backlog=engine_config.yield_backlog,
        yield_max_streams=engine_config.yield_max_streams,
        yield_ready=engine_config.yield_ready,
    )
    if pacing is not None:
        log.info(
            "sharing cores: a step at most every %g ms per %d calls waiting (up to %g ms) while %d or fewer streams decode",
            pacing.yield_step_ms,
            pacing.yield_backlog,
            pacing.yield_max_step_ms,
            pacing.yield_max_streams,
        )
    node = DecodeNode(
        model,
        engine_config,
        data_bind=settings.data_address,
        advertise_host=addresses.data_host,
        liveness=liveness,
        channel_auth=channel_auth,
        pacing=pacing,
    )
    config = node.cluster_config()
    node.publisher = node_publisher("decode", settings, model.model_id, addresses, node.data_address, node.load, liveness, config=config)
    lifecycle = node_lifecycle(
        "decode", settings, node.publisher, liveness, close=node.close, load_fn=node.load, metrics=node.metrics, admission=admission
    )
    asyncio.run(serve(node, settings.grpc_address, lifecycle, auth, admission))
