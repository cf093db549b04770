"""Run one role's server in this process (``tessera serve --role R``)."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from dataclasses import dataclass

from services.engine.config import EngineConfig
from services.preprocess.config import PreprocessConfig
from shared.models.registry import resolve_model
from shared.tracing import configure_tracing

ROLES = ("preprocess", "encoder", "prefill", "decode", "gateway")


@dataclass(frozen=True, slots=True)
class RoleConfig:
    role: str
    model: str = "tiny"
    grpc_address: str = "127.0.0.1:0"
    data_address: str = "tcp://127.0.0.1:0"
    # The cache index (redis://host:port/db or memory://); empty: this node publishes nothing.
    index_url: str = ""
    index_ttl_s: float = 5.0
    # prefill only: the pull-or-recompute cost model for prefix KV (services/prefill/kv_pull.py)
    kv_pull_bandwidth_gbps: float = 1.0
    kv_pull_overhead_ms: float = 5.0
    kv_pull_timeout_s: float = 10.0
    prefill_ms_per_token: float = 0.7  # initial estimate; refined from measured prefills
    # gateway only
    http_host: str = "127.0.0.1"
    http_port: int = 8000
    generate_address: str = "127.0.0.1:50051"
    preprocess_address: str = ""
    encoder_address: str = ""
    prefill_address: str = ""
    decode_address: str = ""
    default_max_tokens: int = 256
    routing_policy: str = "cache_aware"
    request_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if self.role == "prefill" and not self.encoder_address:
            raise ValueError("the prefill role needs --encoder-address")
        for name in ("kv_pull_bandwidth_gbps", "kv_pull_timeout_s", "prefill_ms_per_token"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.kv_pull_overhead_ms < 0:
            raise ValueError("kv_pull_overhead_ms must be >= 0")
        if self.role == "gateway" and not all((self.preprocess_address, self.encoder_address, self.prefill_address, self.decode_address)):
            raise ValueError("the gateway needs --preprocess-address, --encoder-address, --prefill-address and --decode-address (comma-separated lists)")
        from services.router.scoring import POLICIES

        if self.routing_policy not in POLICIES:
            raise ValueError(f"routing_policy must be one of {', '.join(POLICIES)}, got {self.routing_policy!r}")


def run_role(config: RoleConfig, engine_config: EngineConfig, preprocess_config: PreprocessConfig) -> None:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {config.role} %(levelname)s %(message)s")
    configure_tracing(config.role)
    model = resolve_model(config.model)
    if config.role == "gateway":
        _run_gateway(config, model.model_id if config.model not in ("tiny", "small") else config.model, model.model_id, engine_config.block_size)
        return
    if config.role == "preprocess":
        from services.preprocess.node import PreprocessNode
        from services.preprocess.server import serve

        index = None
        if config.index_url:
            from shared.index.backend import create_index

            index = create_index(config.index_url, namespace=model.model_id)
        coroutine = serve(PreprocessNode(model, preprocess_config, index=index), config.grpc_address)
    elif config.role == "encoder":
        from services.encoder.node import EncoderNode
        from services.encoder.server import serve

        node = EncoderNode(model, data_bind=config.data_address, cache_tokens=engine_config.encoder_cache_tokens, device=engine_config.device)
        node.publisher = _publisher(config, model.model_id, node.data_address, None)
        coroutine = serve(node, config.grpc_address)
    elif config.role == "prefill":
        from services.prefill.node import PrefillNode
        from services.prefill.server import serve

        node = PrefillNode(
            model,
            engine_config,
            data_bind=config.data_address,
            kv_pull_bandwidth_bytes_per_s=config.kv_pull_bandwidth_gbps * 1e9,
            kv_pull_overhead_s=config.kv_pull_overhead_ms / 1000,
            kv_pull_timeout_s=config.kv_pull_timeout_s,
            prefill_s_per_token=config.prefill_ms_per_token / 1000,
        )
        node.publisher = _publisher(config, model.model_id, node.data_address, node.load)
        coroutine = serve(node, config.grpc_address, config.encoder_address)
    else:
        from services.decode.node import DecodeNode
        from services.decode.server import serve

        node = DecodeNode(model, engine_config, data_bind=config.data_address)
        node.publisher = _publisher(config, model.model_id, node.data_address, node.load)
        coroutine = serve(node, config.grpc_address)
    asyncio.run(coroutine)


def _publisher(config: RoleConfig, namespace: str, data_address: str, load_fn):
    if not config.index_url:
        return None
    from shared.index.backend import create_index
    from shared.index.publisher import IndexPublisher
    from shared.index.types import NodeInfo

    info = NodeInfo(node_id=f"{config.role}@{config.grpc_address}", role=config.role, grpc_address=config.grpc_address, data_address=data_address)
    kwargs = {"load_fn": load_fn} if load_fn is not None else {}
    return IndexPublisher(create_index(config.index_url, namespace=namespace), info, ttl_s=config.index_ttl_s, **kwargs)


def _run_gateway(config: RoleConfig, served_model: str, namespace: str, block_size: int) -> None:
    from services.gateway.generate_server import GenerateServicer, start_generate_server
    from services.gateway.http_server import GatewayApp, make_server
    from services.gateway.pipeline import Pipeline, RoleAddresses

    from services.router.router import RoleNodes, Router

    split = lambda text: tuple(a.strip() for a in text.split(",") if a.strip())  # noqa: E731
    addresses = RoleAddresses(split(config.preprocess_address), split(config.encoder_address), split(config.prefill_address), split(config.decode_address))
    index = None
    if config.index_url:
        from shared.index.backend import create_index

        index = create_index(config.index_url, namespace=namespace)
    router = Router(RoleNodes(addresses.encoder, addresses.prefill, addresses.decode), policy=config.routing_policy, index=index, block_size=block_size)
    pipeline = Pipeline(addresses, router=router, timeout_s=config.request_timeout_s)
    generate = start_generate_server(
        GenerateServicer(pipeline, served_model=served_model, default_max_tokens=config.default_max_tokens), config.generate_address
    )
    http = make_server(GatewayApp(pipeline, served_model=served_model, default_max_tokens=config.default_max_tokens), config.http_host, config.http_port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    thread = threading.Thread(target=http.serve_forever, name="http", daemon=True)
    thread.start()
    logging.getLogger("tessera").info("gateway on http://%s:%d, Generate on %s", config.http_host, http.server_port, config.generate_address)
    stop.wait()
    http.shutdown()
    generate.stop(grace=5).wait()
