"""The gateway role's server: the OpenAI HTTP API (FastAPI on uvicorn) and the public Generate
service over one Pipeline, with nodes discovered through the index (or static lists without one).

Both servers and every call to the nodes run on one asyncio event loop.

Drain on SIGTERM: stop accepting (HTTP listener closed, /health 503, new requests 503, Generate
refuses new calls), let the requests in flight finish for up to ``drain_timeout_s``, then exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import uvicorn

from services.gateway.app import create_app
from services.gateway.generate_server import GenerateServicer, start_generate_server
from services.gateway.pipeline import Pipeline
from services.gateway.tenants import ApiKeys
from services.models.sampling_defaults import GENERATION_CONFIG_MODES, NO_DEFAULTS, SamplingDefaults, read_sampling_defaults
from services.router.membership import ROUTED_ROLES, Membership
from services.router.policies import make_policy
from services.router.router import Router
from services.router.scoring import EncodeDispatch
from services.transport.index_access import open_reader
from services.transport.internal_auth import InternalAuth, InternalPlaneSettings
from shared.startup_heap import freeze_startup_heap

if TYPE_CHECKING:  # the gateway runs no model: it must not load the families' tensor code
    from services.models.registry import ModelRef

log = logging.getLogger("tessera")


@dataclass(frozen=True, slots=True)
class Settings(InternalPlaneSettings):
    """Flags of ``tessera serve --role gateway``, each also ``TESSERA_SERVE_<NAME>``; the internal
    plane's (its secret and mTLS) authenticate the gateway's calls to the nodes."""

    model: str = "tiny"
    # The names the API answers to, comma-separated; the first is the default and the metrics'
    # model_name. Empty: a built-in's own name, or the checkpoint's id.
    served_model_name: str = ""
    http_host: str = "127.0.0.1"
    http_port: int = 8000
    http_backlog: int = 4096  # pending connections the kernel queues before refusing
    http_keep_alive_s: float = 30.0  # an idle client connection is closed after this
    # vLLM's --root-path: the path prefix a path-routing proxy serves the API under ("/llm"); the
    # routes answer with and without it.
    root_path: str = ""
    generate_address: str = "127.0.0.1:50051"
    # Where nodes are discovered (their records are the cluster), and the cache lookups' index.
    index_url: str = ""
    index_ttl_s: float = 5.0
    # Static node lists (comma-separated), for setups without an index.
    preprocess_address: str = ""
    encoder_address: str = ""
    prefill_address: str = ""
    decode_address: str = ""
    default_max_tokens: int = 256
    # Serve the metric families named as vLLM's under vllm: as well as tessera: (dashboards,
    # KEDA triggers and endpoint pickers that read vllm:num_requests_waiting, unchanged).
    vllm_metric_names: bool = False
    # vLLM's --enable-force-include-usage: every stream's chunks carry the usage so far, asked
    # for or not (as stream_options.continuous_usage_stats).
    enable_force_include_usage: bool = False
    # vLLM's --max-logprobs: the most alternatives a request may ask per token (output and prompt
    # tokens alike); -1: the vocabulary, so a request's -1 (all of it) is served.
    max_logprobs: int = 20
    # Sampling defaults for the fields a request leaves unset: "auto", the checkpoint's
    # generation_config.json (as vLLM's --generation-config auto), or "vllm", none.
    generation_config: str = "auto"
    routing_policy: str = "cache_aware"
    # Where images the chosen encoder lacks are encoded: "adaptive" (on a prefill node with its
    # own vision tower when the encoder tier's queue would cost more; services/router/scoring.py),
    # "encoder" (always the encoder tier) or "prefill" (the prefill node whenever it can encode).
    encode_dispatch: str = "adaptive"
    cache_lookups: bool = True  # off: the index serves membership only (a no-reuse baseline)
    request_timeout_s: float = 300.0
    max_node_failures: int = 4  # per request, before it fails with 503
    max_num_requests: int = 2048  # choices in flight at this gateway; past it, 429 with Retry-After
    # Vision tokens in flight per live encoder, priced from image headers before anything is
    # decoded (services/gateway/media_budget.py): past it 429, a request over all of it 413; 0: off.
    max_media_tokens_per_encoder: int = 262144
    # API keys for the HTTP and Generate APIs (services/gateway/tenants.py); neither: no auth.
    api_key: str = ""  # one key, tenant "default"
    api_keys_file: str = ""  # JSON: key -> tenant name, or -> {"tenant": NAME, "shared_cache": BOOL}
    drain_timeout_s: float = 30.0  # on SIGTERM: time open streams get to finish

    def __post_init__(self) -> None:
        InternalPlaneSettings.__post_init__(self)
        static = (self.preprocess_address, self.encoder_address, self.prefill_address, self.decode_address)
        if not self.index_url and not all(static):
            raise ValueError(
                "the gateway needs --index-url (nodes are discovered there), or all of --preprocess-address, "
                "--encoder-address, --prefill-address and --decode-address (comma-separated lists)"
            )
        if self.max_logprobs < -1:
            raise ValueError(f"max_logprobs must be -1 (the vocabulary) or at least 0, got {self.max_logprobs}")
        if self.root_path and (not self.root_path.startswith("/") or self.root_path.endswith("/")):
            raise ValueError(f"root_path must start with '/' and not end with one (as '/llm'), got {self.root_path!r}")
        if self.generation_config not in GENERATION_CONFIG_MODES:
            raise ValueError(f"generation_config must be one of {', '.join(GENERATION_CONFIG_MODES)}, got {self.generation_config!r}")
        make_policy(self.routing_policy)  # raises for an unknown name, naming the known ones
        EncodeDispatch(self.encode_dispatch)  # likewise
        non_negative = (self.max_node_failures, self.drain_timeout_s, self.max_media_tokens_per_encoder)
        if self.index_ttl_s <= 0 or min(non_negative) < 0 or self.max_num_requests < 1:
            raise ValueError(
                "index_ttl_s must be positive, max_node_failures, drain_timeout_s and max_media_tokens_per_encoder >= 0, "
                "max_num_requests >= 1"
            )


def main(settings: Settings, model: ModelRef, engine_config, preprocess_config) -> None:
    run_gateway(
        settings,
        served_names=served_names(settings, model),
        namespace=model.model_id,
        block_size=engine_config.block_size,
        max_model_len=engine_config.max_model_len,
        tool_parser=model.tool_call_parser,
        sampling_defaults=read_sampling_defaults(model.path, settings.generation_config),
    )


def served_names(settings: Settings, model: ModelRef) -> tuple[str, ...]:
    """--served-model-name's names, in order, each once; without it a built-in is served under
    its own name ("tiny", "gemma3-tiny") and a checkpoint under its name (a Hub id, a directory's)."""
    names = tuple(dict.fromkeys(n.strip() for n in settings.served_model_name.split(",") if n.strip()))
    return names or (model.builtin or model.name,)


def build_pipeline(config: Settings, *, namespace: str, block_size: int, max_model_len: int) -> Pipeline:
    index = open_reader(config.index_url, namespace=namespace, settings=config) if config.index_url else None
    static = {role: tuple(a.strip() for a in getattr(config, f"{role}_address").split(",") if a.strip()) for role in ROUTED_ROLES}
    membership = Membership(
        index, static if index is None else None, refresh_s=min(1.0, config.index_ttl_s / 3), quarantine_s=config.index_ttl_s
    )
    router = Router(
        membership,
        policy=make_policy(config.routing_policy),
        index=index if config.cache_lookups else None,
        block_size=block_size,
        encode_dispatch=config.encode_dispatch,
    )
    return Pipeline(
        router,
        timeout_s=config.request_timeout_s,
        max_failures=config.max_node_failures,
        auth=InternalAuth.from_settings(config),
        max_model_len=max_model_len,
    )


def run_gateway(
    config: Settings,
    *,
    served_names: tuple[str, ...],
    namespace: str,
    block_size: int,
    max_model_len: int,
    tool_parser: str | None = None,
    sampling_defaults: SamplingDefaults = NO_DEFAULTS,
) -> None:
    # uvicorn re-raises the signal that stopped it once it has shut down, with the handler it
    # found installed: ours, so a drained gateway exits 0 instead of dying of its SIGTERM.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    asyncio.run(_serve(config, served_names, namespace, block_size, max_model_len, tool_parser, sampling_defaults))


async def _serve(
    config: Settings,
    served_names: tuple[str, ...],
    namespace: str,
    block_size: int,
    max_model_len: int,
    tool_parser: str | None,
    sampling_defaults: SamplingDefaults,
) -> None:
    api_keys = ApiKeys.from_settings(config.api_key, config.api_keys_file)
    pipeline = build_pipeline(config, namespace=namespace, block_size=block_size, max_model_len=max_model_len)
    await pipeline.membership.start()
    app, state = create_app(
        pipeline,
        served_names=served_names,
        default_max_tokens=config.default_max_tokens,
        max_num_requests=config.max_num_requests,
        api_keys=api_keys,
        model_root=config.model,
        tool_parser=tool_parser,
        sampling_defaults=sampling_defaults,
        vllm_metric_names=config.vllm_metric_names,
        max_media_tokens_per_encoder=config.max_media_tokens_per_encoder,
        force_include_usage=config.enable_force_include_usage,
        root_path=config.root_path,
        max_logprobs=config.max_logprobs,
    )
    servicer = GenerateServicer(
        pipeline,
        served_names=served_names,
        default_max_tokens=config.default_max_tokens,
        tool_parser=tool_parser,
        sampling_defaults=sampling_defaults,
    )
    generate = await start_generate_server(servicer, config.generate_address, api_keys=api_keys)
    try:
        await _serve_until_drained(config, app, state, generate)
    finally:
        await pipeline.membership.stop()
        if pipeline.membership.index is not None:
            await pipeline.membership.index.close()
    log.info("drained; exiting with %d requests unfinished", state.num_in_flight)


async def _serve_until_drained(config: Settings, app, state, generate) -> None:
    """Serve HTTP until SIGTERM/SIGINT; then drain: new requests get 503 and Generate refuses new
    calls while open streams get up to ``drain_timeout_s`` to finish."""
    loop = asyncio.get_running_loop()
    generate_stopped: list[asyncio.Task] = []

    def drain() -> None:
        if not generate_stopped:
            log.info("draining: %d requests in flight", state.num_in_flight)
            state.draining = True
            generate_stopped.append(loop.create_task(generate.stop(grace=config.drain_timeout_s)))

    uvicorn_config = uvicorn.Config(
        app,
        host=config.http_host,
        port=config.http_port,
        log_level="warning",
        access_log=False,
        backlog=config.http_backlog,
        timeout_graceful_shutdown=config.drain_timeout_s,
        timeout_keep_alive=config.http_keep_alive_s,
    )
    # Signal handlers run on the loop's own thread, between its steps.
    server = _DrainingServer(uvicorn_config, on_exit=lambda: loop.call_soon(drain))
    address, frozen = f"http://{config.http_host}:{config.http_port}", freeze_startup_heap()
    log.info("gateway on %s, Generate on %s (%d start-up objects frozen)", address, config.generate_address, frozen)
    try:
        await server.serve()  # returns once SIGTERM/SIGINT has stopped it and its open streams ended
    finally:
        drain()
        await asyncio.wait(generate_stopped, timeout=config.drain_timeout_s)


class _DrainingServer(uvicorn.Server):
    """uvicorn's server, which on SIGTERM/SIGINT first marks the gateway draining (new requests
    get 503, /health says so, Generate refuses new calls), then stops listening and waits for
    open streams for up to the drain timeout."""

    def __init__(self, config: uvicorn.Config, *, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_exit = on_exit

    def handle_exit(self, sig, frame) -> None:
        self.on_exit()
        super().handle_exit(sig, frame)
