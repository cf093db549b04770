"""docker-compose.yml as typed records, read with nothing started: each service's command,
environment, healthcheck, ports (``expose`` and ``ports``), volumes, stop signal and grace period,
and the start order given by ``depends_on`` and its conditions. A service others wait for with
``service_completed_successfully`` (model-init) is a one-shot.

tests/deploy/compose_mapping.py maps one replica of a service onto this machine and
tests/deploy/compose_local.py starts the processes.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
# Images the harness can stand in for locally, with the container port they serve.
_REDIS_IMAGES = ("valkey/valkey", "redis", "valkey")
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
    """``value`` as Compose hands it on: ``$$`` is a literal ``$`` (for the container's shell);
    a variable Compose itself would interpolate is refused."""
    unescaped = value.replace("$$", "")
    if "${" in unescaped or re.search(r"\$[A-Za-z_]", unescaped):
        raise ValueError(f"{where}: variable interpolation is not supported by this harness: {value!r}")
    return value.replace("$$", "$")


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
