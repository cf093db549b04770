"""The one way to dial another node: a channel that carries the internal token on every call and,
with mTLS configured, this node's client certificate (services/transport/internal_auth.py says
why). The gateway uses blocking channels, prefill nodes asyncio ones; both come from here, so no
internal call can leave without its credentials."""

from __future__ import annotations

import collections

import grpc

from services.transport.grpc_server import CHANNEL_OPTIONS
from services.transport.internal_auth import TOKEN_METADATA_KEY, InternalAuth


def internal_channel(address: str, auth: InternalAuth, *, aio: bool = False) -> grpc.Channel | grpc.aio.Channel:
    """A channel to the node at ``address`` (blocking, or grpc.aio with ``aio``)."""
    options = list(CHANNEL_OPTIONS)
    credentials = None
    if auth.tls is not None:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=auth.tls.root_ca, private_key=auth.tls.private_key, certificate_chain=auth.tls.cert_chain
        )
        if auth.tls.server_name is not None:  # nodes share one certificate, named once, not per address
            options.append(("grpc.ssl_target_name_override", auth.tls.server_name))
    token = auth.token
    if aio:
        interceptors = [] if token is None else [_AioUnaryToken(token), _AioStreamToken(token)]
        if credentials is None:
            return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
        return grpc.aio.secure_channel(address, credentials, options=options, interceptors=interceptors)
    channel = grpc.insecure_channel(address, options=options) if credentials is None else grpc.secure_channel(address, credentials, options)
    return channel if token is None else grpc.intercept_channel(channel, _Token(token))


class _CallDetails(
    collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")),
    grpc.ClientCallDetails,
):
    pass


class _Token(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds the token to a blocking channel's calls, after whatever metadata (tracing) they carry."""

    def __init__(self, token: str) -> None:
        self._token = token

    def _details(self, details: grpc.ClientCallDetails) -> _CallDetails:
        return _CallDetails(
            details.method,
            details.timeout,
            [*(details.metadata or ()), (TOKEN_METADATA_KEY, self._token)],
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)


class _AioToken:
    """The same for a grpc.aio channel; one class per call kind, as grpc.aio files each
    interceptor under the first kind it implements only."""

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
