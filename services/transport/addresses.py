"""Bind addresses versus advertised addresses.

A node binds where it listens (in a container: 0.0.0.0) and advertises, in the index, the
address other nodes should dial (the pod IP or the service DNS name). The advertised host is the
configured one; else the bind host, unless that is a wildcard, in which case the address this
host's name resolves to (a container's own IP in compose and Kubernetes).
"""

from __future__ import annotations

import socket

_WILDCARDS = ("", "0.0.0.0", "::", "[::]", "*")


def split_host_port(address: str) -> tuple[str, int]:
    """ "host:port" or "tcp://host:port" -> (host, port)."""
    host, sep, port = address.removeprefix("tcp://").rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {address!r} must be host:port")
    return host, int(port)


def advertised_host(bind_host: str, advertise_host: str = "") -> str:
    if advertise_host:
        return advertise_host
    if bind_host not in _WILDCARDS:
        return bind_host
    return socket.gethostbyname(socket.gethostname())


def advertise(bound: str, advertise_host: str = "") -> str:
    """The address to register for a socket bound at ``bound`` (same scheme and port)."""
    host, port = split_host_port(bound)
    scheme = "tcp://" if bound.startswith("tcp://") else ""
    return f"{scheme}{advertised_host(host, advertise_host)}:{port}"
