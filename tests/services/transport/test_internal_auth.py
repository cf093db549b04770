"""The internal plane's gRPC authentication on a real grpc.aio server: calls without the cluster's
token are refused UNAUTHENTICATED before any servicer code runs, health stays open, and the
channel factory every caller uses sends the token."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from protos.gen import pb, rpc
from services.transport.grpc_server import new_server
from services.transport.internal_auth import TOKEN_METADATA_KEY, InternalAuth, InternalPlaneSettings, add_port
from services.transport.internal_channel import internal_channel
from services.transport.kv_peer import add_kv_peer
from tests.certificates import make_certificates

SECRET = b"a-test-secret-of-enough-bytes"
STREAM_METHOD = "/tessera.test.Stream/Count"


class FakeExporter:
    def __init__(self) -> None:
        self.num_calls = 0

    async def export_kv(self, hashes, target, transfer_id) -> int:
        self.num_calls += 1
        return len(hashes)


async def _count(request: bytes, context):
    for i in range(3):
        yield bytes([i])


async def _serve(auth: InternalAuth, exporter: FakeExporter) -> tuple[grpc.aio.Server, str]:
    """A node's server (new_server + add_port, as serve_forever binds) with KVPeer, health and a
    server-streaming method."""
    server = new_server(auth)
    add_kv_peer(server, exporter)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    stream = grpc.unary_stream_rpc_method_handler(_count)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("tessera.test.Stream", {"Count": stream}),))
    port = add_port(server, "127.0.0.1:0", auth)
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    return server, f"127.0.0.1:{port}"


def _export(channel, metadata=()) -> int:
    request = pb.ExportKVRequest(block_hashes=["a", "b"], target_data_address="tcp://127.0.0.1:1", transfer_id="t")
    return rpc.KVPeerStub(channel).ExportKV(request, timeout=10, metadata=metadata).num_blocks


async def _export_over(channel: grpc.aio.Channel) -> int:
    request = pb.ExportKVRequest(block_hashes=["a", "b"], target_data_address="tcp://127.0.0.1:1", transfer_id="t")
    return (await rpc.KVPeerStub(channel).ExportKV(request, timeout=10)).num_blocks


def _stream(channel, metadata=()) -> list[bytes]:
    call = channel.unary_stream(STREAM_METHOD)(b"", timeout=10, metadata=metadata)
    return list(call)


def test_calls_need_the_cluster_token_and_health_stays_open():
    auth = InternalAuth(SECRET)
    exporter = FakeExporter()

    async def scenario() -> None:
        server, address = await _serve(auth, exporter)
        try:
            await asyncio.to_thread(check, address)
        finally:
            await server.stop(None)

    def check(address: str) -> None:
        with grpc.insecure_channel(address) as plain:
            with pytest.raises(grpc.RpcError) as missing:
                _export(plain)
            assert missing.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert TOKEN_METADATA_KEY in missing.value.details() and "internal secret" in missing.value.details()
            with pytest.raises(grpc.RpcError) as wrong:
                _export(plain, metadata=((TOKEN_METADATA_KEY, InternalAuth(b"another-secret-of-enough-bytes").token),))
            assert wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED and "does not match" in wrong.value.details()
            with pytest.raises(grpc.RpcError) as raw_secret:  # the token is derived: the secret itself is no token
                _export(plain, metadata=((TOKEN_METADATA_KEY, SECRET.decode()),))
            assert raw_secret.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as stream:
                _stream(plain)
            assert stream.value.code() == grpc.StatusCode.UNAUTHENTICATED
            reply = health_pb2_grpc.HealthStub(plain).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        assert exporter.num_calls == 0, "a refused call reached the servicer"

    asyncio.run(scenario())


def test_the_channel_factory_sends_the_token_after_the_calls_own_metadata():
    auth = InternalAuth(SECRET)

    async def scenario() -> None:
        server, address = await _serve(auth, FakeExporter())
        channel = internal_channel(address, auth)
        try:
            request = pb.ExportKVRequest(block_hashes=["a"], target_data_address="tcp://127.0.0.1:1", transfer_id="t")
            reply = await rpc.KVPeerStub(channel).ExportKV(request, timeout=10, metadata=(("traceparent", "x"),))
            assert reply.num_blocks == 1
            chunks = [chunk async for chunk in channel.unary_stream(STREAM_METHOD)(b"", timeout=10)]
            assert chunks == [b"\x00", b"\x01", b"\x02"]
            async with grpc.aio.insecure_channel(address) as plain:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await rpc.KVPeerStub(plain).ExportKV(request, timeout=10)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        finally:
            await channel.close()
            await server.stop(None)

    asyncio.run(scenario())


def test_without_a_secret_the_plane_stays_open():
    async def scenario() -> None:
        server, address = await _serve(InternalAuth(), FakeExporter())
        try:
            await asyncio.to_thread(lambda: _check_open(address))
            async with internal_channel(address, InternalAuth(SECRET)) as channel:  # a token is simply ignored
                assert await _export_over(channel) == 2
        finally:
            await server.stop(None)

    def _check_open(address: str) -> None:
        with grpc.insecure_channel(address) as plain:
            assert _export(plain) == 2

    asyncio.run(scenario())


def test_the_secret_comes_from_its_file_before_the_environment(tmp_path):
    secret_file = tmp_path / "secret"
    secret_file.write_text("from-the-file-0123456789\n")
    settings = InternalPlaneSettings(internal_secret_file=secret_file)
    from_file = InternalAuth.from_settings(settings, env={"TESSERA_INTERNAL_SECRET": "x" * 20})
    assert from_file.secret == b"from-the-file-0123456789"
    from_env = InternalAuth.from_settings(InternalPlaneSettings(), env={"TESSERA_INTERNAL_SECRET": "from-the-environment-42"})
    assert from_env.secret == b"from-the-environment-42"
    assert InternalAuth.from_settings(InternalPlaneSettings(), env={}).secret is None
    # Each use gets its own derived key, and the secret never shows in a repr.
    assert from_env.token not in (None, "from-the-environment-42") and from_env.tensor_key != from_env.secret
    assert "from-the-environment" not in repr(from_env)
    with pytest.raises(ValueError, match="at least 16"):
        InternalAuth(b"short")
    secret_file.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        InternalAuth.from_settings(settings, env={})
    with pytest.raises(ValueError, match="all of"):
        InternalPlaneSettings(internal_tls_cert=secret_file)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make test certificates")
def test_mtls_serves_only_clients_with_a_certificate_from_the_cluster_ca(tmp_path):
    # The `cryptography` package is not installed here; the openssl command makes the certificates.
    make_certificates(tmp_path)
    settings = InternalPlaneSettings(
        internal_tls_cert=tmp_path / "node.pem",
        internal_tls_key=tmp_path / "node.key",
        internal_tls_ca=tmp_path / "ca.pem",
        internal_tls_server_name="tessera-internal",
    )
    auth = InternalAuth.from_settings(settings, env={"TESSERA_INTERNAL_SECRET": SECRET.decode()})
    assert auth.tls is not None and "PRIVATE KEY" not in repr(auth)

    async def scenario() -> None:
        server, address = await _serve(auth, FakeExporter())
        try:
            async with internal_channel(address, auth) as channel:
                assert await _export_over(channel) == 2
            await asyncio.to_thread(check, address)
        finally:
            await server.stop(None)

    def check(address: str) -> None:
        # Without a client certificate the TLS handshake itself fails, token or not.
        no_client_cert = grpc.ssl_channel_credentials(root_certificates=auth.tls.root_ca)
        options = (("grpc.ssl_target_name_override", "tessera-internal"),)
        with grpc.secure_channel(address, no_client_cert, options) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                _export(channel, metadata=((TOKEN_METADATA_KEY, auth.token),))
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        with grpc.insecure_channel(address) as plain:  # plaintext to a TLS port
            with pytest.raises(grpc.RpcError):
                _export(plain, metadata=((TOKEN_METADATA_KEY, auth.token),))
        # `tessera health` speaks mTLS with the node's flags, and fails without them.
        tls_flags = [f"--internal-tls-cert={tmp_path / 'node.pem'}", f"--internal-tls-key={tmp_path / 'node.key'}"]
        tls_flags += [f"--internal-tls-ca={tmp_path / 'ca.pem'}", "--internal-tls-server-name=tessera-internal"]
        assert _tessera_health(address, *tls_flags).returncode == 0
        assert _tessera_health(address).returncode == 1

    asyncio.run(scenario())


def _tessera_health(address: str, *flags: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "services.cli.main", "health", address, "--timeout-s", "5", *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env={k: v for k, v in os.environ.items() if "TLS" not in k})
