"""Hosts for multi-host tests on one machine: each host a Linux network namespace with its own
address on a bridge, as containers on a compose network are.

* One bridge per ``HostNetwork`` in the root namespace, holding the first address of a /24 from
  198.18.0.0/15 (RFC 2544's range for benchmark networks, routed nowhere), so the test process
  reaches every host; each host gets a veth pair onto it and the next address.
* A host's ``/etc/hosts`` (``/etc/netns/<name>/hosts``, which ``ip netns exec`` mounts over the
  real one) maps this machine's host name to the host's own address, as Docker's does for a
  container, and service names (``valkey``) to theirs, as compose's DNS would.
* Everything is named ``ts<pid>...`` after the process that made it; a network whose maker is
  gone is removed when the next one is made, so a crashed run leaves nothing behind for long.

``namespaces_unavailable()`` says why hosts cannot be made here (not root, no ``ip``), or None.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

NETNS_ETC = Path("/etc/netns")
_RANGE = ipaddress.ip_network("198.18.0.0/15")
_OURS = re.compile(r"^ts(\d+)[hb]")
MAX_HOSTS = 200


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def namespaces_unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None where they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "iproute2's ip command is not installed"
    probe = f"ts{os.getpid()}hprobe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass(frozen=True, slots=True)
class Host:
    name: str  # the network namespace
    address: str  # its one address on the bridge

    def command(self, argv: tuple[str, ...] | list[str]) -> tuple[str, ...]:
        """``argv`` run on this host."""
        return ("ip", "netns", "exec", self.name, *argv)


class HostNetwork:
    """A bridge and the hosts on it; ``close`` removes them all (processes on them must be
    stopped first: a namespace lives while a process is in it)."""

    def __init__(self) -> None:
        _remove_orphans()
        self.tag = f"ts{os.getpid()}"
        self.bridge = f"{self.tag}b"
        self.subnet = _free_subnet()
        self.gateway_address = str(self.subnet[1])
        self.hosts: list[Host] = []
        self.names_to_addresses: dict[str, str] = {}  # service names every host resolves
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway_address}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def add_host(self) -> Host:
        number = len(self.hosts) + 1
        if number > MAX_HOSTS:
            raise RuntimeError(f"at most {MAX_HOSTS} hosts on one network")
        host = Host(f"{self.tag}h{number}", str(self.subnet[number + 1]))
        veth = f"{self.tag}v{number}"
        _ip("netns", "add", host.name)
        self.hosts.append(host)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", host.name)
        _ip("link", "set", veth, "master", self.bridge, "up")
        _ip("netns", "exec", host.name, "ip", "link", "set", "lo", "up")
        _ip("netns", "exec", host.name, "ip", "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip("netns", "exec", host.name, "ip", "link", "set", "eth0", "up")
        self._write_hosts_file(host)
        return host

    def name_service(self, name: str, address: str) -> None:
        """Make ``name`` resolve to ``address`` on every host (existing and later ones)."""
        self.names_to_addresses[name] = address
        for host in self.hosts:
            self._write_hosts_file(host)

    def _write_hosts_file(self, host: Host) -> None:
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback", f"{host.address} {socket.gethostname()}"]
        lines += [f"{address} {name}" for name, address in self.names_to_addresses.items()]
        directory = NETNS_ETC / host.name
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "hosts").write_text("\n".join(lines) + "\n")

    def close(self) -> None:
        for host in self.hosts:
            _ip("netns", "del", host.name, check=False)
            shutil.rmtree(NETNS_ETC / host.name, ignore_errors=True)
        self.hosts.clear()
        _ip("link", "del", self.bridge, check=False)

    def __enter__(self) -> HostNetwork:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of 198.18.0.0/15 that no interface here uses yet."""
    used = _ip("-o", "-4", "addr", "show").stdout
    subnets = list(_RANGE.subnets(new_prefix=24))
    start = os.getpid() % len(subnets)
    for offset in range(len(subnets)):
        subnet = subnets[(start + offset) % len(subnets)]
        if f" {subnet.network_address}".rsplit(".", 1)[0] + "." not in used:
            return subnet
    raise RuntimeError("no free /24 in 198.18.0.0/15")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_orphans() -> None:
    """Namespaces and bridges of ours whose maker has exited."""
    names = [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.strip()]
    for name in names:
        match = _OURS.match(name)
        if match and not _alive(int(match[1])):
            _ip("netns", "del", name, check=False)
            shutil.rmtree(NETNS_ETC / name, ignore_errors=True)
    for line in _ip("-o", "link", "show", "type", "bridge", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        match = _OURS.match(name)
        if match and not _alive(int(match[1])):
            _ip("link", "del", name, check=False)
