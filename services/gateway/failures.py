"""What counts as a node's failure (retried on another node), a busy node (tried elsewhere, or a
429), and the request's own error (returned to the client), and one request's budgets: node
failures, and time."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from services.gateway.admission import rate_limited
from services.gateway.errors import GatewayError
from services.router.router import NoLiveNodeError
from services.transport.grpc_server import FAILED_NODE_KEY, HTTP_STATUS_KEY, OVERLOADED_KEY

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

    def no_node_left(self, exc: NoLiveNodeError) -> GatewayError:
        """A role has no node left for this request: 429 when the ones there are were busy (the
        client should come back soon), else 503."""
        if exc.role in self.busy_roles:
            return rate_limited(f"every {exc.role} node is at its limit of requests")
        return GatewayError(503, f"{exc}: retry when nodes have joined")


def classify_rpc_error(role: str, address: str, exc: grpc.RpcError) -> NodeFailure | NodeOverloaded | GatewayError:
    """A node's failure (retried elsewhere), a busy node (tried elsewhere, without quarantine), or
    the request's own error (returned to the client)."""
    detail = exc.details() or exc.code().name
    busy = trailing_value(exc, OVERLOADED_KEY)
    if busy is not None and exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
        busy_role, _, busy_address = busy.partition("=")  # "role": the node called; "role=address": one it called
        return NodeOverloaded(busy_role, busy_address or address, detail)
    failed = trailing_value(exc, FAILED_NODE_KEY)
    if failed is not None:
        failed_role, _, failed_address = failed.partition("=")
        return NodeFailure(failed_role, failed_address, detail)
    status = trailing_value(exc, HTTP_STATUS_KEY)
    if status is not None:
        return GatewayError(int(status), detail or f"{role} rejected the request")
    if exc.code() in _NODE_FAILURE_CODES:
        return NodeFailure(role, address, detail)
    return GatewayError(500, f"the {role} service failed: {detail}")


def trailing_value(exc: grpc.RpcError, key: str) -> str | None:
    try:
        metadata = exc.trailing_metadata() or ()
    except Exception:
        return None
    for k, v in metadata:
        if k == key:
            return v
    return None


def remaining_s(deadline: float, now: float) -> float:
    """A call's gRPC timeout: what is left of the request's deadline; 504 once nothing is."""
    left = deadline - now
    if left <= 0:
        raise GatewayError(504, "the request ran out of time before its next step", code="deadline_exceeded")
    return left
