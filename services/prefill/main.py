"""``tessera serve --role prefill``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from services.engine.config import EngineConfig
from services.models.registry import ModelRef
from services.transport.node_admission import NodeAdmission
from services.transport.node_runtime import NodeSettings, node_addresses, node_auth, node_lifecycle, node_publisher
from shared.colocation import host_backlog
from shared.liveness import Liveness


@dataclass(frozen=True, slots=True)
class Settings(NodeSettings):
    # The pull-or-recompute cost model for prefix KV (services/prefill/kv_pull.py).
    kv_pull_bandwidth_gbps: float = 1.0
    kv_pull_overhead_ms: float = 5.0
    kv_pull_timeout_s: float = 10.0
    prefill_ms_per_token: float = 0.7  # initial estimate; refined from measured prefills
    # Load the vision tower too, so the router may have this node encode a request's images
    # itself while the encoder tier is queued (adaptive dispatch, services/router/scoring.py).
    local_encode: bool = True

    def __post_init__(self) -> None:
        NodeSettings.__post_init__(self)
        for name in ("kv_pull_bandwidth_gbps", "kv_pull_timeout_s", "prefill_ms_per_token"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.kv_pull_overhead_ms < 0:
            raise ValueError("kv_pull_overhead_ms must be >= 0")


def main(settings: Settings, model: ModelRef, engine_config: EngineConfig, preprocess_config) -> None:
    from services.prefill.node import PrefillNode
    from services.prefill.server import serve

    liveness = Liveness(stall_s=settings.liveness_stall_s)
    poster = host_backlog.poster_from_env()
    admission = NodeAdmission("prefill", settings.max_pending_requests, on_change=poster)
    auth, channel_auth = node_auth(settings)
    addresses = node_addresses(settings)
    node = PrefillNode(
        model,
        engine_config,
        data_bind=settings.data_address,
        advertise_host=addresses.data_host,
        liveness=liveness,
        kv_pull_bandwidth_bytes_per_s=settings.kv_pull_bandwidth_gbps * 1e9,
        kv_pull_overhead_s=settings.kv_pull_overhead_ms / 1000,
        kv_pull_timeout_s=settings.kv_pull_timeout_s,
        prefill_s_per_token=settings.prefill_ms_per_token / 1000,
        channel_auth=channel_auth,
        local_encode=settings.local_encode,
        post_ready=poster.post_ready if poster is not None else None,
    )
    config = node.cluster_config()
    node.publisher = node_publisher(
        "prefill", settings, model.model_id, addresses, node.data_address, node.load, liveness, config=config, can_encode=node.can_encode
    )
    if node.publisher is not None:
        node.publisher.adapters_fn = node.adapters.fingerprints
    lifecycle = node_lifecycle(
        "prefill", settings, node.publisher, liveness, close=node.close, load_fn=node.load, metrics=node.metrics, admission=admission
    )
    asyncio.run(serve(node, settings.grpc_address, lifecycle, auth, admission))
