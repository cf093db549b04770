"""``tessera serve --role encoder``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from services.encoder.batching import default_max_batch_rows
from services.engine.config import EngineConfig
from services.models.registry import ModelRef
from services.transport.node_admission import NodeAdmission
from services.transport.node_runtime import NodeSettings, node_addresses, node_auth, node_lifecycle, node_publisher
from shared.colocation import host_backlog
from shared.liveness import Liveness


@dataclass(frozen=True, slots=True)
class Settings(NodeSettings):
    # Concurrent Encode calls run as one vision-tower pass while their embedding rows fit this
    # (services/encoder/batching.py); a larger call still runs, alone. None: the device's
    # default, one call per pass on CPU and 16384 rows on an accelerator.
    max_batch_rows: int | None = None

    def __post_init__(self) -> None:
        NodeSettings.__post_init__(self)
        if self.max_batch_rows is not None and self.max_batch_rows < 1:
            raise ValueError("max_batch_rows must be at least 1")


def main(settings: Settings, model: ModelRef, engine_config: EngineConfig, preprocess_config) -> None:
    from services.encoder.node import EncoderNode
    from services.encoder.server import serve

    liveness = Liveness(stall_s=settings.liveness_stall_s)
    admission = NodeAdmission("encoder", settings.max_pending_requests, on_change=host_backlog.poster_from_env())
    auth, channel_auth = node_auth(settings)
    addresses = node_addresses(settings)
    node = EncoderNode(
        model,
        data_bind=settings.data_address,
        advertise_host=addresses.data_host,
        cache_tokens=engine_config.encoder_cache_tokens,
        device=engine_config.device,
        prepack=engine_config.prepack_vision,
        liveness=liveness,
        channel_auth=channel_auth,
        lora=engine_config,
    )

    def load() -> tuple[float, float]:
        # Encode calls wait for their batch in the servicer (so a cancelled one leaves the line):
        # the admitted calls are the node's queue, and its load.
        return float(admission.num_pending), 0.0

    config = node.cluster_config()
    node.publisher = node_publisher("encoder", settings, model.model_id, addresses, node.data_address, load, liveness, config=config)
    if node.publisher is not None:
        node.publisher.adapters_fn = node.adapters.fingerprints
    lifecycle = node_lifecycle(
        "encoder", settings, node.publisher, liveness, close=node.close, load_fn=load, metrics=node.metrics, admission=admission
    )
    max_batch_rows = settings.max_batch_rows or default_max_batch_rows(engine_config.device)
    asyncio.run(serve(node, settings.grpc_address, lifecycle, auth, admission, max_batch_rows=max_batch_rows))
