"""What counts as a node's failure (retried on another node) and what is the request's own error
(returned to the client), and one request's budgets: node failures, and time."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from services.gateway.errors import GatewayError
from services.transport.grpc_server import FAILED_NODE_KEY, HTTP_STATUS_KEY

# gRPC codes that mean "the node failed", not "the request is bad": retried on another node.
_NODE_FAILURE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED)


class NodeFailure(Exception):
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

    def record(self, failure: NodeFailure) -> None:
        self.failures.append(failure)
        if failure.address:
            self.excluded.add(failure.address)
        if len(self.failures) > self.max_failures:
            raise GatewayError(503, f"gave up after {len(self.failures)} node failures; last: {failure}")


def classify_rpc_error(role: str, address: str, exc: grpc.RpcError) -> NodeFailure | GatewayError:
    """A node's failure (retried elsewhere) or the request's own error (returned to the client)."""
    detail = exc.details() or exc.code().name
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
