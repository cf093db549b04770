"""``tessera serve --role R`` refuses to start, before loading its model, where it would advertise
an address its peers cannot dial: a wildcard ``--advertise-host``, or a loopback address (here,
what this machine's name resolves to) with its index on another host. The message names
``--advertise-host``; the exit status is EX_CONFIG (78), which the launcher never restarts."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from services.transport.addresses import is_loopback_host

REMOTE_INDEX = "redis://192.0.2.10:6379/0"  # TEST-NET-1: never dialled, the node stops first


def _serve(*flags: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_SERVE_")}
    return subprocess.run(
        [sys.executable, "-m", "services.cli.main", "serve", "--role", "encoder", "--model", "tiny", "--index-url", REMOTE_INDEX, *flags],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_a_wildcard_advertise_host_refuses_to_start():
    result = _serve("--grpc-address", "0.0.0.0:50061", "--data-address", "tcp://0.0.0.0:50071", "--advertise-host", "0.0.0.0")
    assert result.returncode == 78, result.stderr[-2000:]
    assert "--advertise-host '0.0.0.0' is a wildcard" in result.stderr


def test_a_name_resolving_to_loopback_with_a_remote_index_refuses_to_start():
    if not is_loopback_host(socket.gethostbyname(socket.gethostname())):
        pytest.skip("this machine's name resolves to a routable address")
    result = _serve("--grpc-address", "0.0.0.0:50061", "--data-address", "tcp://0.0.0.0:50071")
    assert result.returncode == 78, result.stderr[-2000:]
    assert "would advertise the loopback address" in result.stderr and "Set --advertise-host" in result.stderr
    assert "192.0.2.10" in result.stderr
