"""The gateway role's server: the OpenAI HTTP API and the public Generate service over one
Pipeline, with nodes discovered through the index (or static lists without one).

Drain on SIGTERM: stop accepting (HTTP listener closed, /health 503, new requests 503, Generate
refuses new calls), let the requests in flight finish for up to ``drain_timeout_s``, then exit.
"""

from __future__ import annotations

import logging
import signal
import threading
import time

from services.gateway.generate_server import GenerateServicer, start_generate_server
from services.gateway.http_server import GatewayApp, make_server
from services.gateway.pipeline import Pipeline
from services.router.membership import ROUTED_ROLES, Membership
from services.router.router import Router
from services.stack.roles import RoleConfig
from shared.index.backend import create_index

log = logging.getLogger("tessera")


def build_pipeline(config: RoleConfig, *, namespace: str, block_size: int) -> Pipeline:
    index = create_index(config.index_url, namespace=namespace) if config.index_url else None
    static = {role: tuple(a.strip() for a in getattr(config, f"{role}_address").split(",") if a.strip()) for role in ROUTED_ROLES}
    membership = Membership(
        index, static if index is None else None, refresh_s=min(1.0, config.index_ttl_s / 3), quarantine_s=config.index_ttl_s
    )
    membership.start()
    router = Router(membership, policy=config.routing_policy, index=index if config.cache_lookups else None, block_size=block_size)
    return Pipeline(router, timeout_s=config.request_timeout_s, max_failures=config.max_node_failures)


def run_gateway(config: RoleConfig, *, served_model: str, namespace: str, block_size: int) -> None:
    pipeline = build_pipeline(config, namespace=namespace, block_size=block_size)
    app = GatewayApp(pipeline, served_model=served_model, default_max_tokens=config.default_max_tokens)
    generate = start_generate_server(
        GenerateServicer(pipeline, served_model=served_model, default_max_tokens=config.default_max_tokens), config.generate_address
    )
    http = make_server(app, config.http_host, config.http_port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    thread = threading.Thread(target=http.serve_forever, name="http", daemon=True)
    thread.start()
    log.info("gateway on http://%s:%d, Generate on %s", config.http_host, http.server_port, config.generate_address)
    stop.wait()
    log.info("draining: %d requests in flight", app.num_in_flight)
    app.draining = True
    http.shutdown()  # no new connections; handlers already running go on
    http.server_close()
    stopped = generate.stop(grace=config.drain_timeout_s)
    deadline = time.monotonic() + config.drain_timeout_s
    while app.num_in_flight and time.monotonic() < deadline:
        time.sleep(0.1)
    stopped.wait(max(0.0, deadline - time.monotonic()))
    pipeline.membership.stop()
    log.info("drained; exiting with %d requests unfinished", app.num_in_flight)
