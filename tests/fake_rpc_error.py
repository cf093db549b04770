"""A failed gRPC call without a server: what a node's stub raises, for tests of what the gateway
does with it."""

from __future__ import annotations

import grpc

from services.transport.node_error import GRPC_CODE, NODE_ERROR_KEY, NodeError


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str = "", trailing: tuple = ()) -> None:
        self._code, self._details, self._trailing = code, details, trailing

    def code(self):
        return self._code

    def details(self):
        return self._details

    def trailing_metadata(self):
        return self._trailing


def failed_with(error: NodeError) -> FakeRpcError:
    """A call a node failed with ``error``, as services.transport.node_error.abort_with fails it."""
    return FakeRpcError(GRPC_CODE[error.kind], error.message, ((NODE_ERROR_KEY, error.to_pb().SerializeToString()),))
