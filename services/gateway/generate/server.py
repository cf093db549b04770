"""The public gRPC Generate service (for product backends): the same pipeline as the HTTP API,
over a typed request (prompt, sampling, n, request id; typed.py) or, deprecated, the
chat body as JSON; and Embed, one prompt's embedding (frontend/embeddings.py). Each
chunk is one step of one choice: its token ids, text delta and logprobs,
and on the choice's last chunk its finish reason and usage. A grpc.aio server on the gateway's event
loop: a call the client cancels cancels its handler's task, and with it the request's work on
every node."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import NoReturn

import grpc

from protos.gen import pb, rpc
from services.gateway.errors import GatewayError
from services.gateway.frontend.embeddings import embed_all
from services.gateway.frontend.frontend import Admitted, Frontend
from services.gateway.frontend.openai_api import Generation, chat_body, check_model
from services.gateway.frontend.prompt_wire import scoped_prompt
from services.gateway.frontend.tenants import ApiKeys, request_cache_salt
from services.gateway.pipeline.choices import merged_events
from services.gateway.pipeline.token_events import TokenEvent, TokenLogprob
from services.transport.api_key_auth import ApiKeyInterceptor, current_principal
from services.transport.grpc_server import SERVER_OPTIONS

# The HTTP status the same request would get from the HTTP API, for Generate's clients: a string
# trailer of the public surface (nodes report typed errors to the gateway instead, node_error.py).
HTTP_STATUS_KEY = "tessera-http-status"
RETRY_AFTER_KEY = "retry-after"  # seconds, on a RESOURCE_EXHAUSTED that waiting cures (HTTP's Retry-After)

_STATUS_TO_CODE = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ALREADY_EXISTS,  # a media uuid bound to other bytes
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,  # every node of a role busy: retry after a while
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


class GenerateServicer(rpc.GenerateServicer):
    """Generate's door: the wire's request to the Frontend's choices and its events to chunks.
    The Frontend's guards (draining, limits, admission, the media budget) are the HTTP API's."""

    def __init__(self, frontend: Frontend) -> None:
        self.frontend = frontend

    async def Generate(self, request: pb.GenerateRequest, context):
        try:
            request_id, generations = await self._generations(request, current_principal())
            admitted = await self.frontend.admit(generations)
            try:
                async for chunk in self._chunks(request_id, generations, admitted):
                    yield chunk
            finally:
                admitted.release()
        except GatewayError as exc:
            await _abort(context, exc)

    async def Embed(self, request: pb.EmbedRequest, context) -> pb.EmbedResponse:
        """One prompt's embedding, as /v1/embeddings gives it (frontend/embeddings.py)."""
        frontend = self.frontend
        try:
            frontend.check_serves("embeddings")
            frontend.check_open()
            if not request.HasField("prompt"):
                raise GatewayError(400, "the request has no prompt", param="prompt")
            model = check_model(request.model or None, frontend.config.served_names)
            tenant = current_principal()
            dimensions = request.dimensions if request.HasField("dimensions") else None
            salt = request_cache_salt(tenant, request.cache_salt or None)
            request_id = request.request_id or f"embd-{uuid.uuid4().hex}"
            prompt = scoped_prompt(request.prompt, tenant)
            [event] = await embed_all(frontend, [prompt], dimensions=dimensions, cache_salt=salt, request_id=request_id)
        except GatewayError as exc:
            await _abort(context, exc)
        usage = pb.Usage(prompt_tokens=event.num_prompt_tokens, cached_tokens=event.num_cached_tokens)
        return pb.EmbedResponse(embedding=event.embedding, usage=usage, request_id=request_id, model=model)

    async def _generations(self, request: pb.GenerateRequest, tenant) -> tuple[str, tuple[Generation, ...]]:
        """The request id its chunks carry, and one Generation per choice (the current
        principal is the tenant, set by the API-key interceptor when keys are on)."""
        frontend = self.frontend
        frontend.check_serves("generate")
        frontend.check_open()
        if request.HasField("prompt"):
            return await frontend.typed(request, tenant)
        if request.request_json:
            return f"gen-{uuid.uuid4().hex}", await self._from_json(request.request_json, tenant)
        raise GatewayError(400, "the request has no prompt: set prompt (or the deprecated request_json)", param="prompt")

    async def _from_json(self, request_json: str, tenant) -> tuple[Generation, ...]:
        """The deprecated form: the /v1/chat/completions body as JSON."""
        try:
            body = json.loads(request_json)
        except json.JSONDecodeError as exc:
            raise GatewayError(400, f"request_json is not valid JSON: {exc}") from None
        except RecursionError:  # arrays or objects nested thousands deep
            raise GatewayError(400, "request_json nests too deeply to be a chat body") from None
        if not isinstance(body, dict):
            raise GatewayError(400, "request_json must be a JSON object: the /v1/chat/completions body")
        parsed = await self.frontend.chat(chat_body(body, "Generate"), tenant)
        if parsed.beam is not None:
            raise GatewayError(400, "use_beam_search is served on /v1/chat/completions and /v1/completions, not on Generate")
        return parsed.generations

    async def _chunks(self, request_id: str, generations: tuple[Generation, ...], admitted: Admitted) -> AsyncIterator[pb.GenerateChunk]:
        """Each choice's token events as chunks, choices interleaved as they come."""
        index_to_text = {g.index: "" for g in generations}
        index_to_num_tokens = {g.index: 0 for g in generations}

        def open_events(generation: Generation) -> AsyncIterator[TokenEvent]:
            # Nodes key work by the request id: one per choice.
            return self.frontend.events(generation, stream=True, request_id=f"{request_id}.{generation.index}")

        async for generation, event in merged_events(open_events, generations):
            admitted.first_token()  # its images are encoded by now
            index = generation.index
            index_to_num_tokens[index] += len(event.token_ids)
            delta, index_to_text[index] = event.text[len(index_to_text[index]) :], event.text
            usage = None
            if event.finished:
                usage = pb.Usage(
                    prompt_tokens=event.prompt_tokens, completion_tokens=index_to_num_tokens[index], cached_tokens=event.cached_tokens
                )
            yield pb.GenerateChunk(
                text_delta=delta,
                token_ids=event.token_ids,
                finished=event.finished,
                finish_reason=event.finish_reason or "",
                usage=usage,
                index=index,
                logprobs=[_logprob_to_pb(lp) for lp in event.logprobs],
                request_id=request_id,
            )


async def _abort(context, exc: GatewayError) -> NoReturn:
    """End the call with the gRPC status of the error's HTTP status, which a trailer carries too."""
    trailer = [(HTTP_STATUS_KEY, str(exc.status))]
    if (retry_after := exc.headers.get("Retry-After")) is not None:
        trailer.append((RETRY_AFTER_KEY, retry_after))
    context.set_trailing_metadata(tuple(trailer))
    await context.abort(_STATUS_TO_CODE.get(exc.status, grpc.StatusCode.INTERNAL), exc.message)


def _logprob_to_pb(logprob: TokenLogprob) -> pb.TokenLogprob:
    return pb.TokenLogprob(
        token_id=logprob.token_id,
        logprob=logprob.logprob,
        token=logprob.token,
        top_token_ids=[top_id for top_id, _, _ in logprob.top],
        top_tokens=[token for _, token, _ in logprob.top],
        top_logprobs=[value for _, _, value in logprob.top],
    )


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
