"""What counts as a node's failure (retried on another node), a busy node (tried elsewhere, or a
429), and the request's own error (returned to the client), and one request's budgets: node
failures, and time."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from services.gateway.error_kinds import KIND_RULES, Action
from services.gateway.errors import GatewayError, rate_limited
from services.router.route import NoLiveNodeError
from services.transport.node_error import NodeRef, node_error_of

# gRPC codes that mean "the node failed", not "the request is bad": retried on another node.
_NODE_FAILURE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED)


class NodeFailure(Exception):
    def __init__(self, role: str, address: str, detail: str) -> None:
        super().__init__(f"{role} {address}: {detail}")
        self.role = role
        self.address = address


class NodeOverloaded(Exception):
    """The node refused the call as busy (at its limit of requests): healthy, so not quarantined."""

    def __init__(self, role: str, address: str, detail: str) -> None:
        super().__init__(f"{role} {address}: {detail}")
        self.role = role
        self.address = address


class AdapterMissing(NodeOverloaded):
    """The node lacks the request's LoRA adapter (it started after the adapter was loaded at
    runtime): the pipeline loads it there and tries again; if that fails, another node, as for a
    busy one."""


@dataclass(slots=True)
class Attempts:
    """One request's failure budget and the nodes it must avoid."""

    max_failures: int
    excluded: set[str] = field(default_factory=set)
    failures: list[NodeFailure] = field(default_factory=list)
    busy_roles: set[str] = field(default_factory=set)  # roles a node of which refused this request as busy

    def record(self, failure: NodeFailure) -> None:
        self.failures.append(failure)
        if failure.address:
            self.excluded.add(failure.address)
        if len(self.failures) > self.max_failures:
            raise GatewayError(503, f"gave up after {len(self.failures)} node failures; last: {failure}")

    def record_busy(self, busy: NodeOverloaded) -> None:
        """Avoid a busy node for this request only. Not a failure: the budget is untouched, and
        the tries are bounded anyway, each excluding one more node of the role."""
        self.busy_roles.add(busy.role)
        if busy.address:
            self.excluded.add(busy.address)

    def readmit(self, role: str) -> bool:
        """Every node of ``role`` was excluded for this request: let the ones that failed it try
        again, all but the one that failed last. A node that failed once may be well (a call cut
        while its host stalled) after the node the request went to next has died; the last to
        fail is the likeliest still down. Whether any node was readmitted. Bounded: each try
        after it spends the failure budget."""
        failed = [f.address for f in self.failures if f.role == role and f.address]
        readmitted = (set(failed[:-1]) - set(failed[-1:])) & self.excluded
        self.excluded -= readmitted
        return bool(readmitted)

    def no_node_left(self, exc: NoLiveNodeError) -> GatewayError:
        """A role has no node left for this request: 429 when the ones there are were busy (the
        client should come back soon), else 503."""
        if exc.role in self.busy_roles:
            return rate_limited(f"every {exc.role} node is at its limit of requests")
        return GatewayError(503, f"{exc}: retry when nodes have joined")


def classify_rpc_error(role: str, address: str, exc: grpc.RpcError) -> NodeFailure | NodeOverloaded | AdapterMissing | GatewayError:
    """A node's failure (retried elsewhere), a busy node (tried elsewhere, without quarantine), or
    the request's own error (returned to the client): by the kind of the node's typed error, or
    without one (a drain, a dead peer, a deadline) by the gRPC code."""
    detail = exc.details() or exc.code().name
    error = node_error_of(exc)
    if error is not None:
        rule = KIND_RULES[error.kind]
        # The node the error names: the one called, unless it is one that node called (its encoder).
        named = error.node or NodeRef(role)
        named_address = named.address or address
        if rule.action is Action.TRY_ANOTHER:
            return NodeOverloaded(named.role, named_address, detail)
        if rule.action is Action.LOAD_ADAPTER:
            return AdapterMissing(named.role, named_address, detail)
        if rule.action is Action.RETRY_ELSEWHERE:
            return NodeFailure(named.role, named_address, detail)
        if rule.action is Action.REJECT and rule.status is not None:
            return GatewayError(rule.status, detail)
        # RESEND_PIXELS here: the pixels are still missing after the resend; the node's failure as below.
    if exc.code() in _NODE_FAILURE_CODES:
        return NodeFailure(role, address, detail)
    return GatewayError(500, f"the {role} service failed: {detail}")


def remaining_s(deadline: float, now: float) -> float:
    """A call's gRPC timeout: what is left of the request's deadline; 504 once nothing is."""
    left = deadline - now
    if left <= 0:
        raise GatewayError(504, "the request ran out of time before its next step", code="deadline_exceeded")
    return left
