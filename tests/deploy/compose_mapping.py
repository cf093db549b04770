"""How one replica of a docker-compose.yml service (tests/deploy/compose_spec.py) maps onto this
machine: the pure part of tests/deploy/compose_local.py, which starts the processes (nothing here
does). What containers would isolate is mapped onto this machine:

* a service built from this repository runs its command, with a leading ``tessera`` replaced by
  ``python -m services.cli.main`` (and ``python`` by this interpreter), in the repository root;
* every replica gets its own free loopback port for each container port it declares, and every
  ``0.0.0.0``/``127.0.0.1``/``localhost`` address (``host:port``, ``tcp://host:port``, a bare port
  value, a URL inside a healthcheck) is rewritten to ``127.0.0.1:<that replica's port>``; a
  service name (``redis://valkey:6379/0``) becomes ``127.0.0.1:<that service's local port>``;
  ``TESSERA_SERVE_ADVERTISE_HOST`` is set to ``127.0.0.1`` (in compose it stays unset, so a
  node advertises its container IP), so all traffic stays on loopback;
* a named volume becomes a directory (``workdir/volumes/<name>`` unless given), and any value
  under its mount point (``TESSERA_HOME=/data/tessera``) is rewritten to lie under it.

``plan_replica_on_host`` maps a replica onto a host of its own instead (a network namespace:
tests/deploy/netns_hosts.py), where nothing about addresses is rewritten: it binds the
container ports the file names, at the addresses it names (0.0.0.0), dials services by name,
and advertises what its host name resolves to, as in a container. Only volumes are mapped, and
the healthcheck's loopback address becomes the host's, since the harness checks from outside.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.deploy.compose_spec import Service

LOOPBACK = "127.0.0.1"
# Hosts that mean "this container": rewritten to loopback with the replica's own ports.
_SELF_HOSTS = ("0.0.0.0", "127.0.0.1", "localhost", "::", "[::]")
_ADDRESS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)?(?P<host>\[::\]|[A-Za-z0-9_.-]+):(?P<port>\d+)(?![\d.])")


@dataclass(frozen=True, slots=True)
class ReplicaPlan:
    service: str
    number: int  # 1-based, like compose's container numbers
    argv: tuple[str, ...]
    env: Mapping[str, str]  # the compose environment after mapping (the process also inherits PATH etc.)
    ports: Mapping[int, int]  # container port -> the port it is reached at from here
    healthcheck: tuple[str, ...] | None  # argv after mapping
    host: str = LOOPBACK  # the address this replica is reached at from here
    netns: str | None = None  # the network namespace it runs in (None: this one)

    def address(self, container_port: int) -> str:
        return f"{self.host}:{self.ports[container_port]}"

    def grpc_address(self) -> str:
        """The node's gRPC server (the gateway: its Generate server); for valkey, its one port."""
        for key in ("TESSERA_SERVE_GRPC_ADDRESS", "TESSERA_SERVE_GENERATE_ADDRESS"):
            if key in self.env:
                return f"{self.host}:{self.env[key].rpartition(':')[2]}"
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


def redis_plan(service: Service, number: int, allocate_port: Callable[[], int], volume_dirs: Mapping[str, Path]) -> ReplicaPlan:
    """A Redis-compatible image (valkey) stands in as a local Valkey on one free loopback port; its
    environment is mapped like any service's (VALKEY_PASSWORD_FILE then names the local file)."""
    if len(service.container_ports) > 1:
        raise ValueError(f"{service.name}: a Redis image serves one port")
    port = allocate_port()
    ports = {(service.container_ports or (6379,))[0]: port}
    mapper = _Mapper(service, ports, {}, volume_dirs)
    env = {key: mapper.value(value) for key, value in service.environment.items()}
    return ReplicaPlan(service.name, number, ("valkey-server", "--port", str(port)), env, ports, None)


def with_model(argv: Iterable[str], model: str | None) -> tuple[str, ...]:
    """``argv`` serving (``--model X``) or building (``models build X``) ``model`` instead."""
    argv = list(argv)
    if model is None:
        return tuple(argv)
    for i in range(len(argv) - 1):
        if argv[i] == "--model" or (i > 0 and argv[i - 1 : i + 1] == ["models", "build"]):
            argv[i + 1] = model
    return tuple(argv)


def plan_replica_on_host(
    service: Service, number: int, *, host: str, netns: str | None, volume_dirs: Mapping[str, Path], env: Mapping[str, str] | None = None
) -> ReplicaPlan:
    """Replica ``number`` of ``service`` on a host of its own at ``host`` (in ``netns``): its
    command and environment as the file gives them, volumes mapped, plus ``env``."""
    mounts = {target: Path(volume_dirs[source]) for target, source in service.volumes.items()}

    def value(text: str) -> str:
        for target, local in mounts.items():
            if text == target or text.startswith(target + "/"):
                return str(local) + text[len(target) :]
        return text

    def checked_from_here(text: str) -> str:
        return re.sub(r"(?<![\d.])(127\.0\.0\.1|localhost)(?=:\d)", host, value(text))

    planned_env = {key: value(v) for key, v in service.environment.items()}
    if service.command[:1] == ("tessera",):
        planned_env.setdefault("HF_HUB_OFFLINE", "1")
    planned_env.update(env or {})
    argv = local_argv(value(a) for a in service.command)
    health = local_argv(checked_from_here(a) for a in service.healthcheck.test) if service.healthcheck else None
    ports = {p: p for p in service.container_ports}
    return ReplicaPlan(service.name, number, argv, planned_env, ports, health, host=host, netns=netns)
