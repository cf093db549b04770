"""Per-node admission: a node holds at most ``max_pending_requests`` calls queued or running.

Past that, a call is refused at once as OVERLOADED (services/transport/node_error.py), which
the gateway reads as "busy, not broken": it tries another node of the role (without quarantining
this one), or answers 429 with Retry-After. Refusing at the door keeps a node's queue, and so the
latency of everything in it, bounded; without it a burst would queue without limit and the
requests at the back would run out of their deadline in line, after using memory all along.

Servicers run on one asyncio event loop, so checking and reserving are one step (no lock).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import NoReturn

import grpc

from services.transport.node_error import ErrorKind, NodeError, NodeRef, abort_with
from shared.node_metrics import Counter, Gauge, counter, gauge

# The gateway's own admission default (--max-num-requests): everything one gateway admits may sit
# on one node of a role, as in the one-command stack, without a 429 a vLLM user would not get
# (300 concurrent streams on a 1/1/1 stack got 44 refusals at 256). Only a pile-up from several
# gateways, or a node that stopped draining, is refused.
DEFAULT_MAX_PENDING_REQUESTS = 2048


@dataclass(slots=True)
class AdmissionMetrics:
    pending: Gauge = gauge("node_requests_pending", "Calls admitted and not yet finished")
    num_refused: Counter = counter("node_requests_refused_total", "Calls refused as busy: the node was at its limit")


@dataclass(slots=True)
class NodeAdmission:
    role: str
    max_pending_requests: int = DEFAULT_MAX_PENDING_REQUESTS
    num_pending: int = 0  # calls admitted and not yet finished
    metrics: AdmissionMetrics = field(default_factory=AdmissionMetrics)
    # Hears num_pending at each change: an encoder's or prefill node's queue, posted to the host's
    # backlog board for a decode node sharing its cores (shared/colocation/host_backlog.py).
    on_change: Callable[[int], None] | None = None

    def __post_init__(self) -> None:
        if self.max_pending_requests < 1:
            raise ValueError(f"max_pending_requests must be at least 1, got {self.max_pending_requests}")
        self.metrics.pending.read_from(lambda: self.num_pending)

    def try_admit(self) -> bool:
        if self.num_pending >= self.max_pending_requests:
            self.metrics.num_refused.inc()
            return False
        self.num_pending += 1
        if self.on_change is not None:
            self.on_change(self.num_pending)
        return True

    def release(self) -> None:
        self.num_pending -= 1
        if self.on_change is not None:
            self.on_change(self.num_pending)

    @asynccontextmanager
    async def admitted(self, context: grpc.aio.ServicerContext, *, on_refused: Callable[[], None] = lambda: None) -> AsyncIterator[None]:
        """Hold a place for the call's whole duration (streams included). A full node refuses the
        call: ``on_refused`` runs (to drop what was sent ahead for it), then the call fails."""
        if not self.try_admit():
            on_refused()
            message = f"the {self.role} node is at its limit of {self.max_pending_requests} requests queued or running"
            await abort_overloaded(context, NodeRef(self.role), message)
        try:
            yield
        finally:
            self.release()


async def abort_overloaded(context: grpc.aio.ServicerContext, node: NodeRef, message: str) -> NoReturn:
    """Refuse a call because ``node`` (this one, or one called on the request's behalf) is busy;
    raises."""
    await abort_with(context, NodeError(ErrorKind.OVERLOADED, message, node))
