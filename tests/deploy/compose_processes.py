"""One replica of tests/deploy/compose_local.py as a local process: start a planned replica
(tests/deploy/compose_mapping.py's ReplicaPlan), check its compose healthcheck, stop it. The
deployment (start order, scaling, waits) is compose_local.py's; nothing here knows other replicas.

Processes are started in their own session and are SIGKILLed if the harness process dies
(``PR_SET_PDEATHSIG``); each one's stdout and stderr go to its log file.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tests.deploy.compose_mapping import LOOPBACK, ReplicaPlan
from tests.deploy.compose_spec import Service, is_redis_image


def own_session_and_die_with_parent() -> None:
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class PortAllocator:
    """Free loopback ports, never the same one twice (callable: the ``allocate_port`` of
    compose_mapping.plan_replica and redis_plan)."""

    def __init__(self) -> None:
        self._given: set[int] = set()

    def __call__(self) -> int:
        from services.stack.node_process import free_port

        for _ in range(100):
            port = free_port()
            if port not in self._given:
                self._given.add(port)
                return port
        raise RuntimeError("no free port")


@dataclass(slots=True)
class RunningReplica:
    plan: ReplicaPlan
    process: subprocess.Popen
    log_path: Path
    log: IO[bytes] | None = None

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_or_kill(self, timeout_s: float) -> int:
        """Its exit code, waiting up to ``timeout_s`` before SIGKILL."""
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(timeout=10)

    def close(self) -> None:
        if self.log is not None and not self.log.closed:
            self.log.close()


def process_env(plan: ReplicaPlan) -> dict[str, str]:
    """This machine's environment (PATH, the venv) without any TESSERA_* setting of the caller,
    plus the service's mapped compose environment."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
    return {**base, **plan.env}


def _on_its_host(plan: ReplicaPlan, argv: tuple[str, ...]) -> tuple[str, ...]:
    """``argv`` run in the plan's network namespace, if it has one (``ip netns exec`` execs the
    command, so the process keeps the pid Popen gives)."""
    return ("ip", "netns", "exec", plan.netns, *argv) if plan.netns else argv


def spawn(plan: ReplicaPlan, log: IO[bytes], cwd: Path) -> subprocess.Popen:
    """Start ``plan`` in its own session (dying with this process) in ``cwd``, on its host."""
    return subprocess.Popen(
        _on_its_host(plan, plan.argv),
        env=process_env(plan),
        cwd=cwd,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        preexec_fn=own_session_and_die_with_parent,
    )


def run_to_completion(plan: ReplicaPlan, log_path: Path, cwd: Path, timeout_s: float) -> int:
    """Run a one-shot ``plan`` (model-init) to its exit code; TimeoutError after ``timeout_s``."""
    with open(log_path, "wb") as log:
        process = spawn(plan, log, cwd)
        try:
            return process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
            raise TimeoutError(f"{plan.service} did not finish within {timeout_s:.0f}s") from None


def start_built(plan: ReplicaPlan, log_path: Path, cwd: Path) -> RunningReplica:
    """A service built from this repository: its mapped command, logging to ``log_path``."""
    log = open(log_path, "wb")
    return RunningReplica(plan, spawn(plan, log, cwd), log_path, log)


def start_valkey(plan: ReplicaPlan, log_path: Path) -> RunningReplica:
    """A Redis image (compose_mapping.redis_plan) as the embedded Valkey on the plan's one port."""
    from services.stack.redis_server import embedded_valkey_binary, start_redis_server

    port = next(iter(plan.ports.values()))
    password = valkey_password(plan)
    process, _url = start_redis_server(
        embedded_valkey_binary(),
        port,
        password=password,
        preexec_fn=own_session_and_die_with_parent,
        bind="0.0.0.0" if plan.netns else LOOPBACK,  # on a host of its own, as the image binds
        reach_host=plan.host,
        argv_prefix=_on_its_host(plan, ()),
    )
    return RunningReplica(plan, process, log_path)


def valkey_password(plan: ReplicaPlan) -> str | None:
    """The password a Valkey service's command reads from VALKEY_PASSWORD_FILE (None: none)."""
    path = plan.env.get("VALKEY_PASSWORD_FILE")
    return Path(path).read_text().strip() if path else None


def is_healthy(service: Service, run: RunningReplica, cwd: Path, run_command: bool) -> bool:
    """Whether ``run`` passes ``service``'s compose healthcheck, mapped to loopback: a PING for a
    Redis image; ``tessera health ADDR`` answered in this process with the same gRPC health check
    unless ``run_command``; any other check runs its command in ``cwd`` (with its timeout)."""
    if not run.alive:
        return False
    if is_redis_image(service.image) and not service.build:
        from services.stack.redis_server import redis_answers

        url = f"redis://{run.plan.host}:{next(iter(run.plan.ports.values()))}/0"
        return redis_answers(url, password=valkey_password(run.plan), timeout_s=2)
    check = run.plan.healthcheck
    if check is None:
        return True
    if not run_command and service.healthcheck.test[:2] == ("tessera", "health"):
        offset = len(check) - len(service.healthcheck.test)  # `tessera` became several words
        return grpc_serving(check[offset + 2], service.healthcheck.timeout_s)
    try:
        result = subprocess.run(
            check,
            env=process_env(run.plan),
            cwd=cwd,
            capture_output=True,
            timeout=service.healthcheck.timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0


def grpc_serving(address: str, timeout_s: float) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING
