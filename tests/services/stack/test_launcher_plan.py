"""The local stack's process plan: with --host 0.0.0.0 only the gateway's public APIs face
outward; every internal gRPC and data port binds loopback (pure logic: nothing is started)."""

from __future__ import annotations

import contextlib

import pytest

from services.stack.launcher import INTERNAL_HOST, Stack, StackConfig
from shared.colocation.host_backlog import BOARD_VAR, SLOT_VAR


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


def test_each_stack_has_its_own_internal_secret_unless_one_is_configured(monkeypatch):
    from services.transport.internal_auth import SECRET_ENV, InternalAuth

    monkeypatch.delenv(SECRET_ENV, raising=False)
    first, second = Stack(StackConfig()), Stack(StackConfig())
    assert first.internal_secret != second.internal_secret
    InternalAuth(first.internal_secret.encode())  # long enough to be accepted by every role
    monkeypatch.setenv(SECRET_ENV, "configured-by-the-operator")
    assert Stack(StackConfig()).internal_secret == "configured-by-the-operator"


def test_each_role_is_spawned_with_its_cpu_share_and_operator_variables_win(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    stack = Stack(StackConfig(num_encoders=2))
    stack.roles.extend(stack.node_processes(["tessera", "serve"]))
    spawned = {}
    monkeypatch.setattr("services.stack.launcher.subprocess.Popen", lambda argv, env, **_: spawned.setdefault(argv[-1], env))
    for role in stack.roles:
        role.argv.append(role.role)
        stack._spawn(role)
    assert set(spawned) == {"preprocess", "encoder", "encoder-1", "prefill", "decode"}
    for env in spawned.values():
        assert env["OMP_WAIT_POLICY"] == "ACTIVE" and int(env["OMP_NUM_THREADS"]) >= 1
    # Sharing cores, encoders and the prefill node post their queues on one board, which the
    # decode node reads (shared/colocation/host_backlog.py).
    board = stack.backlog_board
    assert board is not None and board.exists()
    assert {name: env.get(SLOT_VAR) for name, env in spawned.items() if env.get(BOARD_VAR) == str(board)} == {
        "encoder": "0",
        "encoder-1": "1",
        "prefill": "2",
        "decode": None,
    }
    for role in stack.roles:
        role.process = None  # nothing was started
    stack.stop()
    assert not board.exists()


def test_a_node_that_died_starting_is_restarted_on_new_internal_ports():
    """Its ports were free when drawn, but another process may have bound them since: the
    retry draws new ones instead of failing on the same port again."""
    from services.stack.launcher import _move_internal_ports

    [decode] = [p for p in Stack(StackConfig()).node_processes(["tessera", "serve"]) if p.role == "decode"]
    old_grpc, old_data = addresses(decode.argv, "--grpc-address"), addresses(decode.argv, "--data-address")
    _move_internal_ports(decode)
    [grpc_address], [data_address] = addresses(decode.argv, "--grpc-address"), addresses(decode.argv, "--data-address")
    assert [grpc_address] != old_grpc and [data_address] != old_data and decode.grpc_address == grpc_address
    assert grpc_address.startswith(f"{INTERNAL_HOST}:") and data_address.startswith(f"tcp://{INTERNAL_HOST}:")


def test_no_two_nodes_are_handed_the_same_port_or_the_gateways(monkeypatch):
    """Ports are drawn before anything binds them: each draw must skip the ones handed out."""
    base = _free_run_of_ports(13)  # 13 ports for 13 uses; other tests' servers may hold some of a fixed run
    monkeypatch.setattr("services.stack.node_process._PORT_RANGE", (base, base + 12))
    stack = Stack(StackConfig(http_port=base, generate_port=base + 1, num_encoders=2, num_decode=2))
    processes = stack.node_processes(["tessera", "serve"])
    ports = [int(a.rsplit(":", 1)[1]) for p in processes for flag in ("--grpc-address", "--data-address") for a in addresses(p.argv, flag)]
    assert len(ports) == 11 and len(set(ports)) == 11 and not {base, base + 1} & set(ports)


def _free_run_of_ports(count: int) -> int:
    """The first of ``count`` consecutive loopback ports in the launcher's range, all free now."""
    import socket

    for base in range(20000, 32000 - count, count):
        with contextlib.ExitStack() as held:
            try:
                for port in range(base, base + count):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
        return base
    raise RuntimeError("no run of free ports")


@pytest.mark.parametrize(("num_cpus", "dispatch"), [(2, "encoder"), (16, "adaptive")])
def test_the_gateway_keeps_images_on_the_encoder_tier_where_the_roles_share_cores(monkeypatch, num_cpus, dispatch):
    from services.stack.launcher import DISPATCH_ENV

    monkeypatch.delenv(DISPATCH_ENV, raising=False)
    monkeypatch.setattr("services.stack.launcher.os.sched_getaffinity", lambda _pid: set(range(num_cpus)))
    monkeypatch.setattr("services.stack.launcher.available_cpus", lambda limit=None: num_cpus)
    stack = Stack(StackConfig())
    stack.roles.extend(stack.node_processes(["tessera", "serve"]))
    stack._cpu_share(stack.roles[0])  # plans every role's share
    assert stack._encode_dispatch_flags() == ["--encode-dispatch", dispatch]
    # The operator's choice stands, as a flag or as its variable.
    chosen = Stack(StackConfig(passthrough=["--encode-dispatch", "adaptive"]))
    assert chosen._encode_dispatch_flags() == []
    monkeypatch.setenv(DISPATCH_ENV, "prefill")
    assert stack._encode_dispatch_flags() == []


@pytest.mark.parametrize(("num_cpus", "towers"), [(2, False), (16, True)])
def test_prefill_nodes_load_no_tower_where_images_stay_on_the_encoder_tier(monkeypatch, num_cpus, towers):
    from services.stack.launcher import DISPATCH_ENV, LOCAL_ENCODE_ENV

    for variable in (DISPATCH_ENV, LOCAL_ENCODE_ENV):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr("services.stack.launcher.os.sched_getaffinity", lambda _pid: set(range(num_cpus)))
    monkeypatch.setattr("services.stack.launcher.available_cpus", lambda limit=None: num_cpus)

    def prefill_loads_a_tower(config: StackConfig) -> bool:
        stack = Stack(config)
        stack.roles.extend(stack.node_processes(["tessera", "serve"]))
        stack._plan_cpus()
        stack._leave_idle_towers_unloaded()
        [prefill] = [r for r in stack.roles if r.role == "prefill"]
        return prefill.argv[-2:] != ["--local-encode", "0"]  # the last word on a flag is the one parsed

    assert prefill_loads_a_tower(StackConfig()) is towers
    # The operator's choice of dispatch, or of the tower itself, stands.
    assert prefill_loads_a_tower(StackConfig(passthrough=["--encode-dispatch", "adaptive"]))
    assert prefill_loads_a_tower(StackConfig(passthrough=["--local-encode", "1"]))
