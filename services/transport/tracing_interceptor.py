"""Server interceptor: each incoming RPC runs inside a span whose parent is the caller's trace
context, read from the request metadata. A no-op when tracing is off."""

from __future__ import annotations

import grpc
from opentelemetry import trace

from shared.tracing import context_from_metadata, tracer, tracing_enabled

_UNTRACED = ("/grpc.health.v1.Health/", "/grpc.reflection.")


class TracingServerInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or not tracing_enabled() or details.method.startswith(_UNTRACED):
            return handler
        parent = context_from_metadata(details.invocation_metadata)
        name = details.method

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary_unary(request, context):
                with tracer().start_as_current_span(name, context=parent, kind=trace.SpanKind.SERVER):
                    return await inner(request, context)

            return grpc.unary_unary_rpc_method_handler(unary_unary, handler.request_deserializer, handler.response_serializer)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def unary_stream(request, context):
                with tracer().start_as_current_span(name, context=parent, kind=trace.SpanKind.SERVER):
                    async for item in inner_stream(request, context):
                        yield item

            return grpc.unary_stream_rpc_method_handler(unary_stream, handler.request_deserializer, handler.response_serializer)
        return handler
