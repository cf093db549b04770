"""The public gRPC Generate service (for product backends): the same pipeline as the HTTP API,
streaming text deltas, with usage on the final chunk. A grpc.aio server on the gateway's event
loop: a call the client cancels cancels its handler's task, and with it the request's work on
every node."""

from __future__ import annotations

import json

import grpc

from protos.gen import pb, rpc
from services.gateway.errors import GatewayError
from services.gateway.openai_api import parse_chat_request
from services.gateway.pipeline import Pipeline
from services.gateway.tenants import ApiKeys
from services.transport.api_key_auth import ApiKeyInterceptor, current_principal
from services.transport.grpc_server import SERVER_OPTIONS

# The HTTP status the same request would get from the HTTP API, for Generate's clients: a string
# trailer of the public surface (nodes report typed errors to the gateway instead, node_error.py).
HTTP_STATUS_KEY = "tessera-http-status"

_STATUS_TO_CODE = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,  # every node of a role busy: retry after a while
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


class GenerateServicer(rpc.GenerateServicer):
    def __init__(
        self, pipeline: Pipeline, *, served_names: tuple[str, ...], default_max_tokens: int, tool_parser: str | None = None
    ) -> None:
        self.pipeline = pipeline
        self.tool_parser = tool_parser
        self.served_names = served_names
        self.default_max_tokens = default_max_tokens

    async def Generate(self, request: pb.GenerateRequest, context):
        try:
            body = json.loads(request.request_json)
            tenant = current_principal()  # set by the API-key interceptor when keys are on
            request = parse_chat_request(
                body,
                served_names=self.served_names,
                default_max_tokens=self.default_max_tokens,
                tenant=tenant,
                tool_parser=self.tool_parser,
            )
            if len(request.generations) != 1:
                raise GatewayError(400, "Generate streams one choice: n must be 1", param="n")
            [generation] = request.generations
            sent, completion_tokens = "", 0
            events = self.pipeline.run(
                generation.prompt, generation.sampling, cache_salt=generation.cache_salt, fit_max_tokens=generation.fit_max_tokens
            )
            async for event in events:
                completion_tokens += len(event.token_ids)
                delta = event.text[len(sent) :]
                sent = event.text
                usage = (
                    pb.Usage(prompt_tokens=event.prompt_tokens, completion_tokens=completion_tokens, cached_tokens=event.cached_tokens)
                    if event.finished
                    else None
                )
                yield pb.GenerateChunk(
                    text_delta=delta,
                    token_ids=event.token_ids,
                    finished=event.finished,
                    finish_reason=event.finish_reason or "",
                    usage=usage,
                )
        except json.JSONDecodeError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request_json is not valid JSON: {exc}")
        except GatewayError as exc:
            context.set_trailing_metadata(((HTTP_STATUS_KEY, str(exc.status)),))
            await context.abort(_STATUS_TO_CODE.get(exc.status, grpc.StatusCode.INTERNAL), exc.message)


async def start_generate_server(servicer: GenerateServicer, address: str, *, api_keys: ApiKeys | None = None) -> grpc.aio.Server:
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection

    interceptors = [ApiKeyInterceptor(api_keys.tenant_for)] if api_keys is not None else []
    server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=interceptors)
    rpc.add_GenerateServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(["tessera.v1.Generate", health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    if server.add_insecure_port(address) == 0:
        raise RuntimeError(f"could not bind gRPC address {address}")
    await server.start()
    for name in ("", "tessera.v1.Generate"):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server
