"""Run one role's server in this process (``tessera serve --role R``): a table from role to entry
point, and what every node shares: its advertised address, its membership in the index (register
once serving, heartbeat while its compute loops make progress, deregister on drain) and its own
metrics endpoint."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from services.engine.config import EngineConfig
from services.preprocess.config import PreprocessConfig
from services.router.scoring import POLICIES
from services.transport.addresses import advertise, split_host_port
from services.transport.grpc_server import Lifecycle
from shared.index.backend import create_index
from shared.index.publisher import IndexPublisher
from shared.index.types import NodeInfo
from shared.liveness import DEFAULT_STALL_S, Liveness
from shared.models.registry import ModelRef, resolve_model
from shared.tracing import configure_tracing

ROLES = ("preprocess", "encoder", "prefill", "decode", "gateway")


@dataclass(frozen=True, slots=True)
class RoleConfig:
    role: str
    model: str = "tiny"
    # Where this node listens, and the host other nodes dial (advertised in the index; default:
    # the bind host, or this host's own address when binding a wildcard such as 0.0.0.0).
    grpc_address: str = "127.0.0.1:0"
    data_address: str = "tcp://127.0.0.1:0"
    advertise_host: str = ""
    node_id: str = ""  # default "role@advertised-grpc-address": stable across restarts in place
    # The cache index and cluster membership (redis://host:port/db); empty: no index.
    index_url: str = ""
    index_ttl_s: float = 5.0
    drain_timeout_s: float = 30.0  # on SIGTERM: time calls in flight get to finish
    liveness_stall_s: float = DEFAULT_STALL_S  # a work item running longer means a hung node
    metrics_port: int = 0  # this node's Prometheus endpoint (0: off)
    # prefill only: the pull-or-recompute cost model for prefix KV (services/prefill/kv_pull.py)
    kv_pull_bandwidth_gbps: float = 1.0
    kv_pull_overhead_ms: float = 5.0
    kv_pull_timeout_s: float = 10.0
    prefill_ms_per_token: float = 0.7  # initial estimate; refined from measured prefills
    # gateway only
    http_host: str = "127.0.0.1"
    http_port: int = 8000
    generate_address: str = "127.0.0.1:50051"
    # Static node lists (comma-separated), for setups without an index.
    preprocess_address: str = ""
    encoder_address: str = ""
    prefill_address: str = ""
    decode_address: str = ""
    default_max_tokens: int = 256
    routing_policy: str = "cache_aware"
    cache_lookups: bool = True  # off: the index serves membership only (a no-reuse baseline)
    request_timeout_s: float = 300.0
    max_node_failures: int = 4  # per request, before it fails with 503

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        for name in ("kv_pull_bandwidth_gbps", "kv_pull_timeout_s", "prefill_ms_per_token", "index_ttl_s", "liveness_stall_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.kv_pull_overhead_ms < 0 or self.drain_timeout_s < 0 or self.max_node_failures < 0:
            raise ValueError("kv_pull_overhead_ms, drain_timeout_s and max_node_failures must be >= 0")
        static = (self.preprocess_address, self.encoder_address, self.prefill_address, self.decode_address)
        if self.role == "gateway" and not self.index_url and not all(static):
            raise ValueError(
                "the gateway needs --index-url (nodes are discovered there), or all of --preprocess-address, "
                "--encoder-address, --prefill-address and --decode-address (comma-separated lists)"
            )
        if self.role != "gateway" and self.index_url and split_host_port(self.grpc_address)[1] == 0:
            raise ValueError("with --index-url a node must bind an explicit --grpc-address port: the index advertises it")
        if self.routing_policy not in POLICIES:
            raise ValueError(f"routing_policy must be one of {', '.join(POLICIES)}, got {self.routing_policy!r}")


def run_role(config: RoleConfig, engine_config: EngineConfig, preprocess_config: PreprocessConfig) -> None:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {config.role} %(levelname)s %(message)s")
    configure_tracing(config.role)
    model = resolve_model(config.model)
    _ENTRY_POINTS[config.role](config, model, engine_config, preprocess_config)


# -- one entry point per role -----------------------------------------------------------------
def _run_preprocess(config: RoleConfig, model: ModelRef, engine_config: EngineConfig, preprocess_config: PreprocessConfig) -> None:
    from services.preprocess.node import PreprocessNode
    from services.preprocess.server import serve

    liveness = Liveness(stall_s=config.liveness_stall_s)
    index = create_index(config.index_url, namespace=model.model_id) if config.index_url else None
    node = PreprocessNode(model, preprocess_config, index=index, liveness=liveness)
    publisher = _publisher(config, model, "", node.load, liveness)
    asyncio.run(serve(node, config.grpc_address, _lifecycle(config, publisher, liveness, node.close, node.load, node.counters)))


def _run_encoder(config: RoleConfig, model: ModelRef, engine_config: EngineConfig, preprocess_config: PreprocessConfig) -> None:
    from services.encoder.node import EncoderNode
    from services.encoder.server import serve

    liveness = Liveness(stall_s=config.liveness_stall_s)
    node = EncoderNode(
        model,
        data_bind=config.data_address,
        cache_tokens=engine_config.encoder_cache_tokens,
        device=engine_config.device,
        liveness=liveness,
    )
    node.publisher = _publisher(config, model, node.data_address, node.load, liveness)
    asyncio.run(serve(node, config.grpc_address, _lifecycle(config, node.publisher, liveness, node.close, node.load, node.counters)))


def _run_prefill(config: RoleConfig, model: ModelRef, engine_config: EngineConfig, preprocess_config: PreprocessConfig) -> None:
    from services.prefill.node import PrefillNode
    from services.prefill.server import serve

    liveness = Liveness(stall_s=config.liveness_stall_s)
    node = PrefillNode(
        model,
        engine_config,
        data_bind=config.data_address,
        liveness=liveness,
        kv_pull_bandwidth_bytes_per_s=config.kv_pull_bandwidth_gbps * 1e9,
        kv_pull_overhead_s=config.kv_pull_overhead_ms / 1000,
        kv_pull_timeout_s=config.kv_pull_timeout_s,
        prefill_s_per_token=config.prefill_ms_per_token / 1000,
    )
    node.publisher = _publisher(config, model, node.data_address, node.load, liveness)
    asyncio.run(serve(node, config.grpc_address, _lifecycle(config, node.publisher, liveness, node.close, node.load, node.counters)))


def _run_decode(config: RoleConfig, model: ModelRef, engine_config: EngineConfig, preprocess_config: PreprocessConfig) -> None:
    from services.decode.node import DecodeNode
    from services.decode.server import serve

    liveness = Liveness(stall_s=config.liveness_stall_s)
    node = DecodeNode(model, engine_config, data_bind=config.data_address, liveness=liveness)
    node.publisher = _publisher(config, model, node.data_address, node.load, liveness)
    asyncio.run(serve(node, config.grpc_address, _lifecycle(config, node.publisher, liveness, node.close, node.load, node.counters)))


def _run_gateway(config: RoleConfig, model: ModelRef, engine_config: EngineConfig, preprocess_config: PreprocessConfig) -> None:
    from services.gateway.server import run_gateway

    served_model = config.model if config.model in ("tiny", "small") else model.model_id
    run_gateway(config, served_model=served_model, namespace=model.model_id, block_size=engine_config.block_size)


_ENTRY_POINTS: dict[str, Callable[[RoleConfig, ModelRef, EngineConfig, PreprocessConfig], None]] = {
    "preprocess": _run_preprocess,
    "encoder": _run_encoder,
    "prefill": _run_prefill,
    "decode": _run_decode,
    "gateway": _run_gateway,
}


# -- what every node shares -------------------------------------------------------------------
def _publisher(config: RoleConfig, model: ModelRef, data_address: str, load_fn, liveness: Liveness) -> IndexPublisher | None:
    if not config.index_url:
        return None
    grpc_address = advertise(config.grpc_address, config.advertise_host)
    data = advertise(data_address, config.advertise_host) if data_address else ""
    info = NodeInfo(
        node_id=config.node_id or f"{config.role}@{grpc_address}", role=config.role, grpc_address=grpc_address, data_address=data
    )
    index = create_index(config.index_url, namespace=model.model_id)
    return IndexPublisher(index, info, ttl_s=config.index_ttl_s, load_fn=load_fn, alive_fn=liveness.is_alive)


def _lifecycle(config: RoleConfig, publisher: IndexPublisher | None, liveness: Liveness, close, load_fn, counters_fn) -> Lifecycle:
    def on_start() -> None:
        if config.metrics_port:
            from services.transport.metrics_http import NodeCollector, start_metrics_server

            host, _ = split_host_port(config.grpc_address)
            start_metrics_server(host, config.metrics_port, NodeCollector(config.role, lambda: load_fn()[0], counters_fn))
        if publisher is not None:
            publisher.start()

    return Lifecycle(
        drain_timeout_s=config.drain_timeout_s,
        on_start=on_start,
        on_drain=publisher.deregister if publisher is not None else None,
        on_stop=close,
        liveness=liveness,
    )
