"""The one way to dial another node: a channel that carries the internal token on every call and,
with mTLS configured, this node's client certificate (services/transport/internal_auth.py says
why). Every caller is asyncio (the gateway, prefill nodes, and tools through node_stats.py), so
there is one kind of channel, grpc.aio; it comes from here, so no internal call can leave without
its credentials."""

from __future__ import annotations

import grpc

from protos.gen import rpc
from services.transport.grpc_server import CHANNEL_OPTIONS
from services.transport.internal_auth import TOKEN_METADATA_KEY, InternalAuth

ROLE_TO_STUB = {"preprocess": rpc.PreprocessStub, "encoder": rpc.EncodeStub, "prefill": rpc.PrefillStub, "decode": rpc.DecodeStub}
# Services every node of several roles serves, by the name a caller asks for them with.
SERVICE_TO_STUB = {"lora_adapters": rpc.LoraAdaptersStub}


def internal_channel(address: str, auth: InternalAuth) -> grpc.aio.Channel:
    """A grpc.aio channel to the node at ``address``."""
    options = list(CHANNEL_OPTIONS)
    credentials = None
    if auth.tls is not None:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=auth.tls.root_ca, private_key=auth.tls.private_key, certificate_chain=auth.tls.cert_chain
        )
        if auth.tls.server_name is not None:  # nodes share one certificate, named once, not per address
            options.append(("grpc.ssl_target_name_override", auth.tls.server_name))
    token = auth.token
    interceptors = [] if token is None else [_AioUnaryToken(token), _AioStreamToken(token)]
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(address, credentials, options=options, interceptors=interceptors)


class _AioToken:
    """Adds the token to a call, after whatever metadata (tracing) it carries; one class per call
    kind, as grpc.aio files each interceptor under the first kind it implements only."""

    def __init__(self, token: str) -> None:
        self._token = token

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), (TOKEN_METADATA_KEY, self._token))
        return details._replace(metadata=metadata)


class _AioUnaryToken(_AioToken, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _AioStreamToken(_AioToken, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)
