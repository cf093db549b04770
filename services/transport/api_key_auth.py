"""API-key authentication for a grpc.aio server, as an interceptor: a call must carry
``authorization: Bearer <key>`` metadata that ``lookup`` resolves to a principal, or it fails with
UNAUTHENTICATED before any servicer code runs. The principal is handed to the servicer through a
context variable (``current_principal``), set inside the call's own task, so no other call sees
it. Health checks and reflection stay open, for probes."""

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


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, lookup: Callable[[str], object | None]) -> None:
        self.lookup = lookup

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
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
    """The handler, with ``principal`` current while it runs (set inside the call's own task)."""
    args = (handler.request_deserializer, handler.response_serializer)
    if handler.unary_stream is not None:
        inner_stream = handler.unary_stream

        async def unary_stream(request, context):
            _principal.set(principal)
            async for item in inner_stream(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(unary_stream, *args)
    if handler.unary_unary is not None:
        inner = handler.unary_unary

        async def unary_unary(request, context):
            _principal.set(principal)
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, *args)
    return handler


def _refusing(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    async def refuse(request, context) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    args = (handler.request_deserializer, handler.response_serializer)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(refuse, *args)
    return grpc.unary_unary_rpc_method_handler(refuse, *args)
