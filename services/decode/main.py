"""``tessera serve --role decode``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from services.engine.config import EngineConfig
from services.models.registry import ModelRef
from services.transport.node_admission import NodeAdmission
from services.transport.node_runtime import NodeSettings, node_auth, node_lifecycle, node_publisher
from shared.liveness import Liveness


@dataclass(frozen=True, slots=True)
class Settings(NodeSettings):
    pass


def main(settings: Settings, model: ModelRef, engine_config: EngineConfig, preprocess_config) -> None:
    from services.decode.node import DecodeNode
    from services.decode.server import serve

    liveness = Liveness(stall_s=settings.liveness_stall_s)
    admission = NodeAdmission("decode", settings.max_pending_requests)
    auth, channel_auth = node_auth(settings)
    node = DecodeNode(model, engine_config, data_bind=settings.data_address, liveness=liveness, channel_auth=channel_auth)
    config = node.cluster_config()
    node.publisher = node_publisher("decode", settings, model.model_id, node.data_address, node.load, liveness, config=config)
    lifecycle = node_lifecycle(
        "decode", settings, node.publisher, liveness, close=node.close, load_fn=node.load, metrics=node.metrics, admission=admission
    )
    asyncio.run(serve(node, settings.grpc_address, lifecycle, auth, admission))
