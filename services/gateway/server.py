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
from typing import TYPE_CHECKING

import uvicorn

from services.gateway.frontend.config import FrontendConfig, ServedModel
from services.gateway.frontend.served_adapters import ServedAdapters
from services.gateway.frontend.tenants import ApiKeys
from services.gateway.generate.server import GenerateServicer, start_generate_server
from services.gateway.http.app import create_app
from services.gateway.pipeline.pipeline import Pipeline
from services.gateway.settings import Settings
from services.models.lora.modules import parse_lora_modules
from services.models.sampling_defaults import NO_DEFAULTS, SamplingDefaults, read_sampling_defaults
from services.router.membership import ROUTED_ROLES, Membership
from services.router.policies import make_policy
from services.router.router import Router
from services.transport.index_access import open_reader
from services.transport.internal_auth import InternalAuth
from shared.startup_heap import freeze_startup_heap

if TYPE_CHECKING:  # the gateway runs no model: it must not load the families' tensor code
    from services.models.registry import ModelRef

log = logging.getLogger("tessera")


def main(settings: Settings, model: ModelRef, engine_config, preprocess_config) -> None:
    run_gateway(
        settings,
        served_names=served_names(settings, model),
        namespace=model.model_id,
        block_size=engine_config.block_size,
        max_model_len=engine_config.max_model_len,
        tool_parser=model.tool_call_parser,
        sampling_defaults=read_sampling_defaults(model.path, settings.generation_config),
        adapters=served_adapters(engine_config, model),
    )


def served_adapters(engine_config, model: ModelRef) -> ServedAdapters | None:
    """The LoRA adapters of --lora-modules (None without --enable-lora)."""
    if not engine_config.enable_lora:
        return None
    return ServedAdapters(parse_lora_modules(engine_config.lora_modules), enabled=True, weight_group=model.weight_group)


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
    adapters: ServedAdapters | None = None,
) -> None:
    # uvicorn re-raises the signal that stopped it once it has shut down, with the handler it
    # found installed: ours, so a drained gateway exits 0 instead of dying of its SIGTERM.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    asyncio.run(_serve(config, served_names, namespace, block_size, max_model_len, tool_parser, sampling_defaults, adapters))


async def _serve(
    config: Settings,
    served_names: tuple[str, ...],
    namespace: str,
    block_size: int,
    max_model_len: int,
    tool_parser: str | None,
    sampling_defaults: SamplingDefaults,
    adapters: ServedAdapters | None = None,
) -> None:
    api_keys = ApiKeys.from_settings(config.api_key, config.api_keys_file)
    pipeline = build_pipeline(config, namespace=namespace, block_size=block_size, max_model_len=max_model_len)
    await pipeline.membership.start()
    model = ServedModel(config.model, tool_parser, sampling_defaults)
    app, frontend = create_app(pipeline, FrontendConfig.from_settings(config, served_names, model, adapters), api_keys=api_keys)
    state = frontend.state
    generate = await start_generate_server(GenerateServicer(frontend), config.generate_address, api_keys=api_keys)
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
