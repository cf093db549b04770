"""How a node fails a call: a typed NodeError (protos/tessera.proto) in the binary trailer
NODE_ERROR_KEY, beside a gRPC status whose details string is the message.

Nodes say what KIND of failure it was, never which HTTP status it becomes: that is the gateway's
one table (services/gateway/error_kinds.py). The gRPC code goes with the kind here, so a node
cannot pair a kind with a code other clients would misread. A call that fails without the trailer
(a drain, a dead peer, a deadline) is classified by its gRPC code alone.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NoReturn

import grpc
from google.protobuf.message import DecodeError

from protos.gen import pb
from shared.types import MmHash

# A "-bin" key: gRPC carries the value as bytes (base64 on the wire), so a serialized message fits.
NODE_ERROR_KEY = "tessera-node-error-bin"


class ErrorKind(enum.Enum):
    """pb.NodeError.Kind, by name (tests/services/transport/test_node_error.py keeps them equal)."""

    INVALID_REQUEST = enum.auto()
    IMAGE_TOO_LARGE = enum.auto()
    IMAGE_SOURCE_NOT_ALLOWED = enum.auto()
    REQUEST_FAILED = enum.auto()
    KV_TRANSFER_TIMEOUT = enum.auto()
    OVERLOADED = enum.auto()
    NODE_FAILED = enum.auto()
    MISSING_PIXELS = enum.auto()
    MEDIA_ID_CONFLICT = enum.auto()
    MISSING_ADAPTER = enum.auto()


# The gRPC code each kind fails its call with: the codes nodes returned before the trailer was
# typed, which clients other than the gateway may read.
GRPC_CODE: dict[ErrorKind, grpc.StatusCode] = {
    ErrorKind.INVALID_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.IMAGE_TOO_LARGE: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.IMAGE_SOURCE_NOT_ALLOWED: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.REQUEST_FAILED: grpc.StatusCode.INTERNAL,
    ErrorKind.KV_TRANSFER_TIMEOUT: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.OVERLOADED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.NODE_FAILED: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.MISSING_PIXELS: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.MISSING_ADAPTER: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.MEDIA_ID_CONFLICT: grpc.StatusCode.ALREADY_EXISTS,
}


@dataclass(frozen=True, slots=True)
class NodeRef:
    role: str
    address: str | None = None  # None: the node that answered the call


@dataclass(frozen=True, slots=True)
class NodeError:
    kind: ErrorKind
    message: str
    node: NodeRef | None = None  # OVERLOADED: the busy node; NODE_FAILED: the failed one
    missing_mm_hashes: tuple[MmHash, ...] = ()  # MISSING_PIXELS

    def to_pb(self) -> pb.NodeError:
        message = pb.NodeError(kind=pb.NodeError.Kind.Value(self.kind.name), missing_mm_hashes=self.missing_mm_hashes)
        if self.node is not None:
            message.node.CopyFrom(pb.NodeRef(role=self.node.role, grpc_address=self.node.address or ""))
        return message

    @staticmethod
    def from_pb(message: pb.NodeError, text: str) -> NodeError | None:
        """None for a kind this side does not know (a newer node's): the caller then goes by the
        gRPC code, as for a call that failed without the trailer."""
        try:
            kind = ErrorKind[pb.NodeError.Kind.Name(message.kind)]
        except (ValueError, KeyError):  # KIND_UNSPECIFIED, or a number this side has no name for
            return None
        node = NodeRef(message.node.role, message.node.grpc_address or None) if message.HasField("node") else None
        return NodeError(kind, text, node, tuple(MmHash(h) for h in message.missing_mm_hashes))


async def abort_with(context: grpc.aio.ServicerContext, error: NodeError) -> NoReturn:
    """Fail the call with ``error``: its kind's gRPC code, its message as the details, the typed
    error in the trailer. Raises, as ``context.abort`` does."""
    context.set_trailing_metadata(((NODE_ERROR_KEY, error.to_pb().SerializeToString()),))
    await context.abort(GRPC_CODE[error.kind], error.message)
    raise AssertionError("context.abort returned")


def node_error_of(exc: grpc.RpcError) -> NodeError | None:
    """The typed error a failed call carries; None when it has none (or none this side reads)."""
    try:
        metadata = exc.trailing_metadata() or ()
    except Exception:  # an RpcError that is not a call (e.g. raised before one was made)
        return None
    for key, value in metadata:
        if key == NODE_ERROR_KEY:
            try:
                message = pb.NodeError.FromString(value)
            except DecodeError:  # a trailer that does not parse is no typed error
                return None
            return NodeError.from_pb(message, exc.details() or exc.code().name)
    return None
