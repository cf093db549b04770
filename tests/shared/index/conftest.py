"""The index backends every conformance suite runs against: in-process, embedded Valkey and
Debian's redis-server (skipped only where the redis-server binary is absent; CI installs it)."""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from shared.index.backend import create_index
from shared.index.memory_backend import InProcessIndex
from tests.fake_clock import FakeClock
from tests.redis_servers import redis_server_binary, running_server, valkey_binary


@pytest.fixture(scope="module", params=["memory", "valkey", "redis-server"])
def index_url(request):
    if request.param == "memory":
        yield "memory://"
        return
    binary = valkey_binary() if request.param == "valkey" else redis_server_binary()
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    with running_server(binary) as url:
        yield url


@pytest.fixture()
def clock(index_url) -> FakeClock | None:
    """The in-process backend runs on an injected clock; a Redis server keeps its own time."""
    return FakeClock() if index_url == "memory://" else None


@pytest.fixture()
def namespace() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


@pytest.fixture()
def index(index_url, clock, namespace):
    backend = InProcessIndex(namespace=namespace, clock=clock) if clock is not None else create_index(index_url, namespace=namespace)
    yield backend
    backend.close()


@pytest.fixture()
def lapse(clock):
    """Let ``seconds`` pass for the index: advance the injected clock, or wait for the server's."""

    def advance(seconds: float) -> None:
        if clock is not None:
            clock.now += seconds
        else:
            time.sleep(seconds)

    return advance


@pytest.fixture()
def restart(index_url, clock, namespace):
    """Bring the ``index`` fixture's namespace back empty, as an index server restarted without persistence:
    a new in-process index, or the namespace's keys deleted on the server."""
    incarnations = []

    def restart_index():
        if clock is not None:
            incarnations.append(InProcessIndex(namespace=namespace, clock=clock))
        else:
            client = redis.Redis.from_url(index_url)
            client.delete(*client.keys(f"tessera:{namespace}:*"))
            client.close()
            incarnations.append(create_index(index_url, namespace=namespace))
        return incarnations[-1]

    yield restart_index
    for incarnation in incarnations:
        incarnation.close()
