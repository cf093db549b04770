"""Reaching a protected index: a password (Valkey/Redis requirepass) and TLS (rediss://) on a real
server, through the same IndexCredentials every Tessera process builds from its settings."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
import redis

from services.stack.node_process import free_port
from services.stack.redis_server import start_redis_server
from services.transport.index_access import PASSWORD_ENV, index_credentials, open_index
from services.transport.internal_auth import InternalPlaneSettings
from shared.index.backend import IndexCredentials, create_index
from shared.index.types import IndexUnavailableError, NodeInfo
from tests.certificates import make_certificates
from tests.redis_servers import valkey_binary

PASSWORD = "index-password-for-tests"
NODE = NodeInfo("prefill-0", "prefill", "127.0.0.1:1", "tcp://127.0.0.1:2")


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()


def test_a_password_protected_index_refuses_writes_without_the_password():
    process, url = start_redis_server(valkey_binary(), free_port(), password=PASSWORD)
    try:
        with pytest.raises(redis.RedisError, match="(?i)auth"):
            redis.Redis.from_url(url).set("k", "v")
        stranger = create_index(url, namespace="n")
        with pytest.raises(IndexUnavailableError):
            stranger.register_node(NODE, ttl_s=30)
        member = create_index(url, namespace="n", credentials=IndexCredentials(password=PASSWORD))
        member.register_node(NODE, ttl_s=30)
        assert set(member.live_nodes()) == {"prefill-0"}
    finally:
        _stop(process)


def test_credentials_come_from_the_password_file_before_the_environment(tmp_path):
    password_file = tmp_path / "index-password"
    password_file.write_text(PASSWORD + "\n")
    from_file = index_credentials(InternalPlaneSettings(index_password_file=password_file), env={PASSWORD_ENV: "other"})
    assert from_file.password == PASSWORD and from_file.username is None
    from_env = index_credentials(InternalPlaneSettings(index_username="tessera"), env={PASSWORD_ENV: "from-env"})
    assert (from_env.username, from_env.password) == ("tessera", "from-env")
    assert index_credentials(InternalPlaneSettings(), env={}).password is None
    assert PASSWORD not in repr(from_file), "a password never shows in a repr (logs, tracebacks)"
    with pytest.raises(ValueError, match="carries a password"):
        open_index("redis://:hunter2@127.0.0.1:6379/0", namespace="n", settings=InternalPlaneSettings(), env={})
    password_file.write_text("")
    with pytest.raises(ValueError, match="is empty"):
        index_credentials(InternalPlaneSettings(index_password_file=password_file), env={})


def _start_tls_server(binary: str, directory: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    process = subprocess.Popen(
        [binary, "-", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        + ["--tls-cert-file", str(directory / "node.pem"), "--tls-key-file", str(directory / "node.key")]
        + ["--tls-ca-cert-file", str(directory / "ca.pem"), "--tls-auth-clients", "no"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    assert process.stdin is not None
    process.stdin.write(f"requirepass {PASSWORD}\n".encode())
    process.stdin.close()
    return process, port


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make test certificates")
def test_a_tls_index_is_reached_over_rediss_with_the_clusters_ca(tmp_path):
    # Debian's redis-server is built with TLS; the embedded Valkey is not.
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    make_certificates(tmp_path, dns_name="index.test", ip="127.0.0.1")
    process, port = _start_tls_server(binary, tmp_path)
    url = f"rediss://127.0.0.1:{port}/0"
    try:
        credentials = IndexCredentials(password=PASSWORD, tls_ca=tmp_path / "ca.pem")
        index = create_index(url, namespace="tls", credentials=credentials)
        deadline = time.monotonic() + 10
        while True:  # the server may still be starting
            try:
                index.register_node(NODE, ttl_s=30)
                break
            except IndexUnavailableError:
                assert time.monotonic() < deadline, "the TLS index never answered"
                time.sleep(0.2)
        assert set(index.live_nodes()) == {"prefill-0"}
        # Without the cluster's CA the server's certificate is not trusted; plain TCP gets nothing.
        untrusted = create_index(url, namespace="tls", credentials=IndexCredentials(password=PASSWORD))
        with pytest.raises(IndexUnavailableError):
            untrusted.live_nodes()
        plain = create_index(f"redis://127.0.0.1:{port}/0", namespace="tls", credentials=IndexCredentials(password=PASSWORD))
        with pytest.raises(IndexUnavailableError):
            plain.live_nodes()
    finally:
        _stop(process)
