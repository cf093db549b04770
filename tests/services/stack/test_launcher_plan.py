"""The local stack's process plan: with --host 0.0.0.0 only the gateway's public APIs face
outward; every internal gRPC and data port binds loopback (pure logic: nothing is started)."""

from __future__ import annotations

import pytest

from services.stack.launcher import INTERNAL_HOST, Stack, StackConfig


def addresses(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


def test_internal_ports_bind_loopback_whatever_the_public_host():
    stack = Stack(StackConfig(host="0.0.0.0", num_encoders=2, num_decode=2))
    processes = stack.node_processes(["tessera", "serve"])
    assert sorted(p.role for p in processes) == ["decode", "decode-1", "encoder", "encoder-1", "prefill", "preprocess"]
    for process in processes:
        [grpc_address] = addresses(process.argv, "--grpc-address")
        assert grpc_address.startswith(f"{INTERNAL_HOST}:") and process.grpc_address == grpc_address
        for data_address in addresses(process.argv, "--data-address"):
            assert data_address.startswith(f"tcp://{INTERNAL_HOST}:")
    assert INTERNAL_HOST == "127.0.0.1"


def test_every_role_needs_a_node():
    with pytest.raises(ValueError, match="at least one node"):
        Stack(StackConfig(num_prefill=0)).node_processes([])
