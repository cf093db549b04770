"""docker-compose.yml as typed records, and how one replica of a service maps onto this machine: the
pure part of tests/deploy/compose_local.py, which starts the processes (nothing here does).

Everything comes from the compose file: each service's command, environment, healthcheck, ports
(``expose`` and ``ports``), volumes, stop signal and grace period, and the start order given by
``depends_on`` and its conditions. What containers would isolate is mapped onto this machine:

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
* a service others wait for with ``service_completed_successfully`` (model-init) is a one-shot.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

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

    def grpc_address(self) -> str:
        """The node's gRPC server (the gateway: its Generate server); for valkey, its one port."""
        for key in ("TESSERA_SERVE_GRPC_ADDRESS", "TESSERA_SERVE_GENERATE_ADDRESS"):
            if key in self.env:
                return self.env[key].removeprefix("tcp://")
        return self.address(next(iter(self.ports))) if self.ports else ""  # e.g. valkey


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


def redis_plan(service: Service, number: int, allocate_port: Callable[[], int]) -> ReplicaPlan:
    """A Redis-compatible image (valkey) stands in as a local Valkey on one free loopback port."""
    if len(service.container_ports) > 1:
        raise ValueError(f"{service.name}: a Redis image serves one port")
    port = allocate_port()
    ports = {(service.container_ports or (6379,))[0]: port}
    return ReplicaPlan(service.name, number, ("valkey-server", "--port", str(port)), {}, ports, None)
