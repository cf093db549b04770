"""The live nodes' Stats, asked of all at once: the gateway's cluster view (/metrics sums, the
media budget's tower speed). Plain reads over the pipeline's stubs and membership."""

from __future__ import annotations

import asyncio

from protos.gen import pb
from services.gateway.pipeline.pipeline import Pipeline
from services.transport.internal_channel import ROLE_TO_STUB
from shared.tracing import outgoing_metadata


async def node_stats(pipeline: Pipeline) -> list[tuple[str, str, pb.StatsResponse]]:
    """Every live node's Stats; a node that does not answer is left out."""
    nodes = [(s.info.role, s.info.grpc_address) for s in pipeline.membership.snapshot().values() if s.info.role in ROLE_TO_STUB]
    answers = await asyncio.gather(
        *(pipeline.stub(role, address).Stats(pb.StatsRequest(), timeout=pipeline.connect_timeout_s) for role, address in nodes),
        return_exceptions=True,
    )
    return [(role, address, answer) for (role, address), answer in zip(nodes, answers) if isinstance(answer, pb.StatsResponse)]


async def tower_seconds_per_token(pipeline: Pipeline) -> float | None:
    """The live encoders' vision-tower seconds per token, as each measured once started
    (services/encoder/calibration.py): the slowest's, None while none reports one."""
    encoders = [n.info.grpc_address for n in pipeline.membership.nodes("encoder")]
    calls = (
        pipeline.stub("encoder", a).Stats(pb.StatsRequest(), timeout=pipeline.connect_timeout_s, metadata=outgoing_metadata())
        for a in encoders
    )
    answers = await asyncio.gather(*calls, return_exceptions=True)
    rates = [a.gauges.get("encoder_tower_seconds_per_token", 0.0) for a in answers if isinstance(a, pb.StatsResponse)]
    return max((r for r in rates if r > 0), default=None)
