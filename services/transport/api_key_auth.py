"""API-key authentication for a (synchronous) gRPC server, as an interceptor: a call must carry
``authorization: Bearer <key>`` metadata that ``lookup`` resolves to a principal, or it fails with
UNAUTHENTICATED before any servicer code runs. The principal is handed to the servicer through a
context variable (``current_principal``), set around the handler on the handler's own thread.
Health checks and reflection stay open, for probes."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

import grpc

_principal: ContextVar[object | None] = ContextVar("tessera_principal", default=None)
OPEN_METHODS = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def current_principal() -> object | None:
    return _principal.get()


def bearer_token(authorization: str | None) -> str | None:
    """The key in an ``Authorization: Bearer <key>`` header or metadata value."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


class ApiKeyInterceptor(grpc.ServerInterceptor):
    def __init__(self, lookup: Callable[[str], object | None]) -> None:
        self.lookup = lookup

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_METHODS):
            return handler
        metadata = {k: v for k, v in handler_call_details.invocation_metadata or () if isinstance(v, str)}
        key = bearer_token(metadata.get("authorization"))
        principal = self.lookup(key) if key is not None else None
        if principal is None:
            message = (
                "a valid API key is required: send 'authorization: Bearer <key>' metadata" if key is None else "the API key is not valid"
            )
            return _refusing(handler, message)
        return _with_principal(handler, principal)


def _with_principal(handler: grpc.RpcMethodHandler, principal: object) -> grpc.RpcMethodHandler:
    if handler.unary_stream is not None:
        inner_stream = handler.unary_stream

        def unary_stream(request, context):
            token = _principal.set(principal)
            try:
                yield from inner_stream(request, context)
            finally:
                _principal.reset(token)

        return grpc.unary_stream_rpc_method_handler(unary_stream, handler.request_deserializer, handler.response_serializer)
    if handler.unary_unary is not None:
        inner = handler.unary_unary

        def unary_unary(request, context):
            token = _principal.set(principal)
            try:
                return inner(request, context)
            finally:
                _principal.reset(token)

        return grpc.unary_unary_rpc_method_handler(unary_unary, handler.request_deserializer, handler.response_serializer)
    return handler


def _refusing(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    def refuse(request, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(refuse, handler.request_deserializer, handler.response_serializer)
    return grpc.unary_unary_rpc_method_handler(refuse, handler.request_deserializer, handler.response_serializer)
