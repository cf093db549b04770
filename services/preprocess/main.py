"""``tessera serve --role preprocess``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from services.models.registry import ModelRef
from services.preprocess.config import PreprocessConfig
from services.transport.index_access import open_bindings, open_index
from services.transport.node_admission import NodeAdmission
from services.transport.node_runtime import NodeSettings, node_addresses, node_auth, node_lifecycle, node_publisher
from shared.index.cluster_config import ClusterConfig
from shared.liveness import Liveness


@dataclass(frozen=True, slots=True)
class Settings(NodeSettings):
    pass


def main(settings: Settings, model: ModelRef, engine_config, preprocess_config: PreprocessConfig) -> None:
    from services.preprocess.node import PreprocessNode
    from services.preprocess.server import serve

    liveness = Liveness(stall_s=settings.liveness_stall_s)
    admission = NodeAdmission("preprocess", settings.max_pending_requests)
    # The index also tells preprocess which images a live encoder holds (their pixels are skipped).
    index = open_index(settings.index_url, namespace=model.model_id, settings=settings) if settings.index_url else None
    # Client media uuids are bound beside the index, so every preprocess node agrees on them.
    bindings = (
        open_bindings(
            settings.index_url,
            namespace=model.model_id,
            settings=settings,
            ttl_s=preprocess_config.uuid_binding_ttl_s,
            max_entries=preprocess_config.max_uuid_bindings,
        )
        if settings.index_url
        else None
    )
    auth, channel_auth = node_auth(settings)
    node = PreprocessNode(model, preprocess_config, index=index, bindings=bindings, liveness=liveness, channel_auth=channel_auth)
    # Pixels are the same whatever the cluster's block size and compute dtype: nothing to agree on.
    addresses = node_addresses(settings, with_inbox=False)
    publisher = node_publisher("preprocess", settings, model.model_id, addresses, None, node.load, liveness, config=ClusterConfig())
    lifecycle = node_lifecycle(
        "preprocess", settings, publisher, liveness, close=node.close, load_fn=node.load, metrics=node.metrics, admission=admission
    )
    asyncio.run(serve(node, settings.grpc_address, lifecycle, auth, admission))
