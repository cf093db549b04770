"""``tessera serve --role decode``."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from services.engine.config import EngineConfig
from services.models.registry import ModelRef
from services.transport.node_admission import NodeAdmission
from services.transport.node_runtime import NodeSettings, node_addresses, node_auth, node_lifecycle, node_publisher
from shared.colocation import host_backlog
from shared.colocation.step_pacing import PacingRule, step_pacing
from shared.liveness import Liveness

log = logging.getLogger("tessera.decode")


@dataclass(frozen=True, slots=True)
class Settings(NodeSettings):
    # A decode node sharing cores with encoder and prefill nodes (a launcher's colocated stack)
    # starts a step at most every yield_step_ms x (queued calls / yield_backlog), up to
    # yield_max_step_ms, while one of those holds yield_backlog or more calls and it holds at most
    # yield_max_streams streams, or a colocated prefill node holds yield_ready or more prompts it
    # could compute now, so queued first tokens get the cores (shared/colocation/step_pacing.py).
    # 0 ms: never yield.
    yield_step_ms: float = 100.0
    yield_max_step_ms: float = 250.0
    yield_backlog: int = 4
    yield_max_streams: int = 16
    yield_ready: int = 2

    def __post_init__(self) -> None:
        NodeSettings.__post_init__(self)
        self.pacing_rule()  # raises for a rule that cannot pace

    def pacing_rule(self) -> PacingRule:
        return PacingRule(self.yield_step_ms, self.yield_max_step_ms, self.yield_backlog, self.yield_max_streams, self.yield_ready)


def main(settings: Settings, model: ModelRef, engine_config: EngineConfig, preprocess_config) -> None:
    from services.decode.node import DecodeNode
    from services.decode.server import serve

    liveness = Liveness(stall_s=settings.liveness_stall_s)
    admission = NodeAdmission("decode", settings.max_pending_requests)
    auth, channel_auth = node_auth(settings)
    addresses = node_addresses(settings)
    pacing = step_pacing(host_backlog.board_from_env(), settings.pacing_rule())
    if pacing is not None:
        rule = pacing.rule
        log.info(
            "sharing cores: a step at most every %g ms per %d calls waiting (up to %g ms) while %d or fewer streams decode",
            rule.step_ms,
            rule.backlog,
            rule.max_step_ms,
            rule.max_streams,
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
    if node.publisher is not None:
        node.publisher.adapters_fn = node.adapters.fingerprints
    lifecycle = node_lifecycle(
        "decode", settings, node.publisher, liveness, close=node.close, load_fn=node.load, metrics=node.metrics, admission=admission
    )
    asyncio.run(serve(node, settings.grpc_address, lifecycle, auth, admission))
