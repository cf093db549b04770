"""Bound addresses versus advertised addresses: two types, so that one is never handed out as the
other.

A node *binds* where it listens (in a container: the wildcard 0.0.0.0) and *advertises* the
address other nodes must dial (the container's or pod's IP, or a name that resolves to it). Every
address that leaves a node (its index record, its Stats reply, the target it names in an Encode
call or a KV pull) is an ``AdvertisedAddress``; a ``BoundAddress`` stays inside the process that
bound it. A wildcard sent to a peer makes the peer dial itself: the embeddings an encoder "sent"
to 0.0.0.0 went into its own container.

The advertised host is chosen once per process (``advertised_host``): the configured
``--advertise-host``; else the bind host, unless that is a wildcard; else the address this host's
name resolves to (a container's own IP in compose and Kubernetes). A wildcard is never
advertised, and neither is a loopback address while the index lives on another host: peers there
would dial themselves. Both refuse the start with ``AdvertiseError``.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

_WILDCARDS = frozenset(("", "0.0.0.0", "::", "[::]", "*"))
_LOOPBACK_NAMES = frozenset(("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"))


class AdvertiseError(ValueError):
    """This node would advertise an address its peers cannot dial."""


def split_host_port(address: str) -> tuple[str, int]:
    """ "host:port" or "tcp://host:port" -> (host, port)."""
    host, sep, port = address.removeprefix("tcp://").rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {address!r} must be host:port")
    return host, int(port)


def _scheme(address: str) -> str:
    return "tcp://" if address.startswith("tcp://") else ""


@dataclass(frozen=True, slots=True)
class BoundAddress:
    """Where a socket of this process listens. Its host may be a wildcard; never sent to a peer."""

    host: str
    port: int
    scheme: str = ""  # "tcp://" for a ZMQ endpoint, "" for gRPC's host:port

    @classmethod
    def parse(cls, address: str) -> BoundAddress:
        host, port = split_host_port(address)
        return cls(host, port, _scheme(address))

    @property
    def is_wildcard(self) -> bool:
        return self.host in _WILDCARDS

    def __str__(self) -> str:
        return f"{self.scheme}{self.host}:{self.port}"


class AdvertisedAddress(str):
    """The address peers dial to reach a socket of this process: what leaves the node. A string
    (it goes on the wire as one); a BoundAddress is not, so it cannot go there by mistake."""

    __slots__ = ()


def advertise(bound: BoundAddress, host: str) -> AdvertisedAddress:
    """``bound``'s socket as peers reach it at ``host`` (from ``advertised_host``)."""
    return AdvertisedAddress(f"{bound.scheme}{host}:{bound.port}")


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or an IP) means this host only: 127.0.0.0/8, ::1 or localhost."""
    host = host.strip("[]").lower()
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def index_is_remote(index_url: str) -> bool:
    """Whether the index at ``index_url`` is reached over the network rather than on this host:
    no index, ``memory://`` and unix sockets are local, and so is a host that resolves only to
    loopback. A host that does not resolve counts as remote (it is surely not this host)."""
    if not index_url:
        return False
    parts = urlsplit(index_url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        return False
    host = parts.hostname
    if is_loopback_host(host):
        return False
    try:
        resolved = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return True
    return not all(is_loopback_host(address) for address in resolved)


def route_source_to(index_url: str) -> str | None:
    """The local address this host uses to reach the index's host (no packet is sent), as a hint
    for the operator; None where it cannot be told."""
    parts = urlsplit(index_url)
    if not parts.hostname:
        return None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((parts.hostname, parts.port or 6379))
            return probe.getsockname()[0]
    except OSError:
        return None


def advertised_host(bind_host: str, advertise_host: str = "", index_url: str = "") -> str:
    """The host this process advertises for sockets bound at ``bind_host`` (see the module
    header); raises AdvertiseError where peers could not dial it."""
    if advertise_host:
        if advertise_host in _WILDCARDS:
            raise AdvertiseError(f"--advertise-host {advertise_host!r} is a wildcard: give the address other nodes dial to reach this one")
        host, how = advertise_host, "--advertise-host"
    elif bind_host not in _WILDCARDS:
        host, how = bind_host, "the bind address"
    else:
        host, how = socket.gethostbyname(socket.gethostname()), f"this host's name ({socket.gethostname()!r})"
    if is_loopback_host(host) and index_is_remote(index_url):
        hint = route_source_to(index_url)
        raise AdvertiseError(
            f"this node would advertise the loopback address {host} (from {how}) while its index is on another host "
            f"({urlsplit(index_url).hostname}): peers would dial themselves. Set --advertise-host "
            f"(TESSERA_SERVE_ADVERTISE_HOST) to the address they reach this node at"
            + (f"; this host reaches the index from {hint}" if hint else "")
        )
    return host
