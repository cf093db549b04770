"""Authentication of the internal plane: the gRPC calls and tensor messages nodes exchange.

Why: internal calls are powerful. ExportKV pushes a node's KV pages to any address it is given,
Encode runs the vision tower for anyone, and a tensor inbox files whatever arrives under any key.
Binding to loopback protects a one-machine stack; in a cluster, anyone who reaches a node's port
could use them. So one secret, shared by every node of a cluster, authenticates both planes:

* gRPC: every call carries ``tessera-internal-token`` metadata, checked (in constant time) by
  ``InternalTokenInterceptor`` before any servicer code runs; a call without it fails
  UNAUTHENTICATED. Health checks and reflection stay open, for probes. The token is derived from
  the secret, not the secret itself: without TLS it travels in clear, and a captured token must
  not yield the tensor channel's key.
* tensors: every message carries an HMAC tag (services/transport/frame_mac.py) under another key
  derived from the secret.
* index: node records are sealed under a third derived key (shared/index/record_seal.py), so
  whoever can write to the index still cannot add a node.

The secret comes from a file (``--internal-secret-file``: a mounted Kubernetes or Compose secret)
or the ``TESSERA_INTERNAL_SECRET`` variable, never from a flag (``ps`` shows command lines).
Without one the plane stays open, as before; a node warns when it binds a non-loopback address
that way. Optional mTLS (``--internal-tls-cert/-key/-ca``) encrypts gRPC and requires a client
certificate signed by the cluster's CA, on top of the token. services/transport/internal_channel.py
is the client side.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from services.transport.api_key_auth import OPEN_METHODS
from shared import process_stats
from shared.node_metrics import Counter, counter

SECRET_ENV = "TESSERA_INTERNAL_SECRET"
TOKEN_METADATA_KEY = "tessera-internal-token"
MIN_SECRET_BYTES = 16
# Fixed labels: each use of the secret gets its own key, so one leaking does not give the other.
_TOKEN_LABEL = b"tessera/internal-plane/grpc-token/v1"
_TENSOR_KEY_LABEL = b"tessera/internal-plane/tensor-mac/v1"
_RECORD_KEY_LABEL = b"tessera/index/node-record-seal/v1"

log = logging.getLogger("tessera")


@dataclass(frozen=True, slots=True)
class InternalPlaneSettings:
    """Flags shared by every role (each also ``TESSERA_SERVE_<NAME>``); the gateway is a client."""

    internal_secret_file: Path | None = None  # else TESSERA_INTERNAL_SECRET; neither: open
    # mTLS, all three or none: this node's certificate (it serves and dials with it), key, and the CA
    # that signed every node's certificate.
    internal_tls_cert: Path | None = None
    internal_tls_key: Path | None = None
    internal_tls_ca: Path | None = None
    # The name every node's certificate carries, when it does not list each node's address.
    internal_tls_server_name: str | None = None
    # The index's credentials (services/transport/index_access.py): an ACL user, its password from
    # a file (else TESSERA_INDEX_PASSWORD; neither: no AUTH), and the CA of a rediss:// server.
    index_username: str = ""
    index_password_file: Path | None = None
    index_tls_ca: Path | None = None
    # How far a node record's seal time may sit from this host's clock beyond its TTL before the
    # record is taken for a replay (shared/index/record_seal.py); the cluster's clocks must agree
    # this closely.
    index_record_max_skew_s: float = 30.0

    def __post_init__(self) -> None:
        given = [p is not None for p in (self.internal_tls_cert, self.internal_tls_key, self.internal_tls_ca)]
        if any(given) and not all(given):
            raise ValueError("mTLS needs all of --internal-tls-cert, --internal-tls-key and --internal-tls-ca")
        if self.index_record_max_skew_s <= 0:
            raise ValueError("index_record_max_skew_s must be positive")


@dataclass(frozen=True, slots=True)
class InternalTls:
    cert_chain: bytes
    private_key: bytes = field(repr=False)
    root_ca: bytes
    server_name: str | None = None


@dataclass(frozen=True, slots=True)
class InternalAuth:
    """The internal plane's credentials in one process; the default is an open plane."""

    secret: bytes | None = field(default=None, repr=False)
    tls: InternalTls | None = None

    def __post_init__(self) -> None:
        if self.secret is not None and len(self.secret) < MIN_SECRET_BYTES:
            raise ValueError(f"the internal secret must be at least {MIN_SECRET_BYTES} bytes")

    @property
    def token(self) -> str | None:
        """The ``tessera-internal-token`` value calls carry (None: no secret)."""
        return None if self.secret is None else hmac.new(self.secret, _TOKEN_LABEL, hashlib.sha256).hexdigest()

    @property
    def tensor_key(self) -> bytes | None:
        """The tensor channel's HMAC key (None: no secret)."""
        return None if self.secret is None else hmac.new(self.secret, _TENSOR_KEY_LABEL, hashlib.sha256).digest()

    @property
    def record_key(self) -> bytes | None:
        """The key sealing node records in the index (shared/index/record_seal.py; None: no secret)."""
        return None if self.secret is None else hmac.new(self.secret, _RECORD_KEY_LABEL, hashlib.sha256).digest()

    @classmethod
    def from_settings(cls, settings: InternalPlaneSettings, env: Mapping[str, str] = os.environ) -> InternalAuth:
        """The secret from ``internal_secret_file``, else from TESSERA_INTERNAL_SECRET; mTLS files
        when given."""
        if settings.internal_secret_file is not None:
            secret: bytes | None = settings.internal_secret_file.read_bytes().strip()
            if not secret:
                raise ValueError(f"the internal secret file {settings.internal_secret_file} is empty")
        else:
            secret = env.get(SECRET_ENV, "").strip().encode() or None
        tls = None
        if settings.internal_tls_cert is not None and settings.internal_tls_key is not None and settings.internal_tls_ca is not None:
            tls = InternalTls(
                settings.internal_tls_cert.read_bytes(),
                settings.internal_tls_key.read_bytes(),
                settings.internal_tls_ca.read_bytes(),
                settings.internal_tls_server_name,
            )
        return cls(secret, tls)


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1", "[::1]") or host.startswith("127.")


def warn_if_open(auth: InternalAuth, bind_hosts: list[str]) -> None:
    """A node reachable from other hosts with no secret serves anyone who reaches it: say so."""
    exposed = [h for h in bind_hosts if not is_loopback(h)]
    if auth.secret is None and exposed:
        log.warning(
            "the internal plane is open: this node binds %s without an internal secret, so anyone who reaches "
            "it can call it and push tensors to it; set --internal-secret-file or %s on every node",
            ", ".join(sorted(set(exposed))),
            SECRET_ENV,
        )


@dataclass(slots=True)
class TokenCheckMetrics:
    num_refused: Counter = counter("internal_calls_refused_total", "Internal calls refused for a missing or wrong token")


class InternalTokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses, UNAUTHENTICATED, every call but health and reflection without the cluster's token."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()
        self.metrics = TokenCheckMetrics()
        process_stats.register(self)  # the node's Stats count refusals

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_METHODS):
            return handler
        sent = next((v for k, v in details.invocation_metadata or () if k == TOKEN_METADATA_KEY), None)
        if isinstance(sent, str) and hmac.compare_digest(sent.encode(), self._token):
            return handler
        self.metrics.num_refused.inc()
        num_refused = int(self.metrics.num_refused.value)  # one event loop: no other refusal in between
        if num_refused & (num_refused - 1) == 0:  # the 1st, 2nd, 4th...: a flood cannot flood the log
            log.warning("refused an internal call to %s without a valid token (%d so far)", details.method, num_refused)
        message = (
            f"internal call without '{TOKEN_METADATA_KEY}' metadata: this node requires the cluster's internal secret"
            if sent is None
            else f"the '{TOKEN_METADATA_KEY}' metadata does not match this node's internal secret"
        )
        return _refusing(handler, message)


def _refusing(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    async def refuse(request, context) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    args = (handler.request_deserializer, handler.response_serializer)
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(refuse, *args)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(refuse, *args)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(refuse, *args)
    return grpc.stream_stream_rpc_method_handler(refuse, *args)


def server_interceptors(auth: InternalAuth) -> list[grpc.aio.ServerInterceptor]:
    return [] if auth.token is None else [InternalTokenInterceptor(auth.token)]


def add_port(server: grpc.aio.Server, address: str, auth: InternalAuth) -> int:
    """Bind ``address``: with mTLS, requiring a client certificate signed by the cluster's CA."""
    if auth.tls is None:
        return server.add_insecure_port(address)
    credentials = grpc.ssl_server_credentials(
        [(auth.tls.private_key, auth.tls.cert_chain)], root_certificates=auth.tls.root_ca, require_client_auth=True
    )
    return server.add_secure_port(address, credentials)
