"""Fetching a remote image without letting a request reach what it should not.

Checks, in order, for the URL and again for every redirect it leads to (at most
``MAX_REDIRECTS``): the scheme is http or https; the host is on the allow-list; every address the
host resolves to is public (not private, loopback, link-local, multicast, reserved or
unspecified, so no metadata endpoint or internal service), unless the operator allows private
addresses. The connection then goes to the address that was checked, not to a second DNS answer
(no rebinding between check and connect); TLS still verifies the certificate for the host name.
The body is read up to the size limit plus one byte, under the fetch timeout.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from services.preprocess.errors import ImageFetchError, ImageSourceNotAllowedError, ImageTooLargeError

MAX_REDIRECTS = 3
_REDIRECTS = (301, 302, 303, 307, 308)

Resolver = Callable[[str, int], list[str]]


@dataclass(frozen=True, slots=True)
class FetchPolicy:
    allowed_domains: tuple[str, ...]
    allow_private_addresses: bool
    timeout_s: float
    max_bytes: int


def fetch(url: str, policy: FetchPolicy, resolve: Resolver | None = None) -> bytes:
    resolve = resolve or _resolve
    for _ in range(MAX_REDIRECTS + 1):
        parts = urllib.parse.urlsplit(url)
        host, port = _checked_target(parts, policy)
        address = _checked_address(host, port, policy, resolve)
        response, connection = _get(parts, host, port, address, policy.timeout_s)
        try:
            if response.status in _REDIRECTS:
                location = response.getheader("Location")
                if not location:
                    raise ImageFetchError(f"{host!r} answered {response.status} without a Location")
                url = urllib.parse.urljoin(url, location)
                continue
            if response.status != 200:
                raise ImageFetchError(f"{host!r} answered HTTP {response.status}")
            data = response.read(policy.max_bytes + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise ImageFetchError(f"could not fetch image from {host!r}: {exc}") from None
        finally:
            connection.close()
        if len(data) > policy.max_bytes:
            raise ImageTooLargeError(f"remote image is over the limit of {policy.max_bytes} bytes")
        return data
    raise ImageFetchError(f"more than {MAX_REDIRECTS} redirects")


def host_allowed(host: str, allowed: tuple[str, ...]) -> bool:
    """Whether ``host`` is on the allow-list; an empty list allows any host (the address check
    still applies)."""
    if not allowed:
        return True
    host = host.lower().rstrip(".")
    return any(host == d or host.endswith("." + d) for d in allowed)


def _checked_target(parts: urllib.parse.SplitResult, policy: FetchPolicy) -> tuple[str, int]:
    if parts.scheme not in ("http", "https"):
        raise ImageSourceNotAllowedError(f"image URLs must be http or https, not {parts.scheme!r}")
    host = parts.hostname or ""
    if not host_allowed(host, policy.allowed_domains):
        raise ImageSourceNotAllowedError(f"image host {host!r} is not on the allowed domain list")
    return host, parts.port or (443 if parts.scheme == "https" else 80)


def _checked_address(host: str, port: int, policy: FetchPolicy, resolve: Resolver) -> str:
    try:
        addresses = resolve(host, port)
    except OSError as exc:
        raise ImageFetchError(f"could not resolve image host {host!r}: {exc}") from None
    if not addresses:
        raise ImageFetchError(f"image host {host!r} has no address")
    if not policy.allow_private_addresses:
        for address in addresses:
            ip = ipaddress.ip_address(address)
            if not ip.is_global or ip.is_multicast:
                raise ImageSourceNotAllowedError(f"image host {host!r} resolves to a non-public address ({address})")
    return addresses[0]


def _get(parts: urllib.parse.SplitResult, host: str, port: int, address: str, timeout_s: float):
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    if parts.scheme == "https":
        connection: http.client.HTTPConnection = _PinnedHTTPSConnection(host, port, address, timeout=timeout_s)
    else:
        connection = _PinnedHTTPConnection(host, port, address, timeout=timeout_s)
    try:
        connection.request("GET", path, headers={"Host": parts.netloc.rpartition("@")[2], "User-Agent": "tessera"})
        return connection.getresponse(), connection
    except (OSError, http.client.HTTPException) as exc:
        connection.close()
        raise ImageFetchError(f"could not fetch image from {host!r}: {exc}") from None


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to ``address`` (already checked), speaking HTTP for ``host``."""

    def __init__(self, host: str, port: int, address: str, *, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, address: str, *, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._address = address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def _resolve(host: str, port: int) -> list[str]:
    return list(dict.fromkeys(info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)))
