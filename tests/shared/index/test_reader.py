"""The router's reader of the index (shared/index/reader.py), against every backend: it answers
what the writer-side index answers, its sealed form lists only trusted records, and a stopped
server delays only the read that asked, never the event loop."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid

import pytest

from services.stack.node_process import free_port
from services.stack.redis_server import start_redis_server
from shared.index.backend import create_index
from shared.index.circuit_breaker import CircuitBreaker
from shared.index.reader import BreakerReader, IndexReader, LocalReader, SealedReader, create_reader
from shared.index.record_seal import RecordSealer
from shared.index.sealed_index import SealedIndex
from shared.index.types import IndexEvents, IndexUnavailableError, MmEntry, NodeInfo
from shared.types import BlockHash, MmHash
from tests.redis_servers import valkey_binary

TTL_S = 30.0
KEY = b"k" * 32


def reader_of(index, index_url: str) -> IndexReader:
    """The reader a router would open on the same index."""
    if index_url == "memory://":
        return LocalReader(index)
    return create_reader(index_url, namespace=namespace_of(index))


def namespace_of(index) -> str:
    return getattr(index, "namespace", None) or index.inner.namespace  # a networked index is behind its breaker


def node(node_id: str, role: str = "prefill") -> NodeInfo:
    return NodeInfo(node_id, role, f"{node_id}:1", f"tcp://{node_id}:2")


def test_a_reader_answers_what_the_index_answers(index, index_url):
    epochs = {n: index.register_node(node(n), ttl_s=TTL_S) for n in ("a", "b")}
    index.publish(
        "a", epochs["a"], IndexEvents(mm_stored={MmHash("img"): MmEntry(4, (1, 2, 2), 64)}, kv_stored={BlockHash("b0"): "device"})
    )
    index.publish("b", epochs["b"], IndexEvents(kv_stored={BlockHash("b0"): "device", BlockHash("b1"): "device"}))
    reader = reader_of(index, index_url)

    async def read():
        try:
            version = (await reader.lookup([], [])).membership_version
            index.register_node(node("c", "decode"), ttl_s=TTL_S)
            looked_up = await reader.lookup([MmHash("img")], [BlockHash("b0"), BlockHash("b1")])
            return looked_up, await reader.live_nodes(), await reader.membership_changes(version)
        finally:
            await reader.close()

    looked_up, live, changes = asyncio.run(read())
    assert looked_up == index.lookup([MmHash("img")], [BlockHash("b0"), BlockHash("b1")])
    assert looked_up.node_to_num_prefix_blocks == {"a": 1, "b": 2}
    assert live == index.live_nodes() and set(live) == {"a", "b", "c"}
    assert changes is not None and set(changes.nodes) == {"c"} and changes.version == looked_up.membership_version


def test_a_sealed_reader_lists_only_trusted_records(index, index_url):
    namespace = namespace_of(index)
    sealed = SealedIndex(index, RecordSealer(KEY, namespace))
    sealed.register_node(node("real"), ttl_s=TTL_S)
    version = index.lookup([], []).membership_version
    index.register_node(node("forged"), ttl_s=TTL_S)  # written past the seal
    reader = SealedReader(reader_of(index, index_url), RecordSealer(KEY, namespace))

    async def read():
        try:
            return await reader.live_nodes(), await reader.membership_changes(version)
        finally:
            await reader.close()

    live, changes = asyncio.run(read())
    assert set(live) == {"real"}
    assert changes is not None and not changes.nodes and "forged" in changes.gone


class DownReader(LocalReader):
    async def lookup(self, mm_hashes, block_hashes):
        self.num_calls = getattr(self, "num_calls", 0) + 1
        raise IndexUnavailableError("down")


def test_a_failing_reader_fails_fast_once_its_breaker_opens():
    from shared.index.memory_backend import InProcessIndex

    down = DownReader(InProcessIndex())
    reader = BreakerReader(down, CircuitBreaker(failure_threshold=2, cooldown_s=60))

    async def lookups() -> int:
        failures = 0
        for _ in range(5):
            try:
                await reader.lookup([], [])
            except IndexUnavailableError:
                failures += 1
        return failures

    assert asyncio.run(lookups()) == 5 and down.num_calls == 2 and reader.breaker.state == "open"


def test_a_stopped_server_delays_the_read_but_never_the_event_loop():
    """SIGSTOP the server: the lookup waits out its socket timeout and fails with
    IndexUnavailableError, while a task ticking every 10 ms on the same loop keeps ticking. A
    blocking client (the redis-py call the gateway once made on its loop) fails this test."""
    process, url = start_redis_server(valkey_binary(), free_port())
    try:
        namespace = f"stall-{uuid.uuid4().hex[:8]}"
        create_index(url, namespace=namespace).register_node(node("a"), ttl_s=TTL_S)
        reader = create_reader(url, namespace=namespace)

        async def stalled_lookup() -> tuple[float, float, bool]:
            await reader.lookup([], [])  # connected, script loaded
            gaps: list[float] = []

            async def tick() -> None:
                last = time.monotonic()
                for _ in range(1000):  # bounded: 10 s at most
                    await asyncio.sleep(0.01)
                    now = time.monotonic()
                    gaps.append(now - last)
                    last = now

            ticker = asyncio.create_task(tick())
            await asyncio.sleep(0.05)
            os.kill(process.pid, signal.SIGSTOP)
            started = time.monotonic()
            try:
                await reader.lookup([MmHash("img")], [BlockHash("b0")])
                failed = False
            except IndexUnavailableError:
                failed = True
            finally:
                os.kill(process.pid, signal.SIGCONT)
            waited = time.monotonic() - started
            await asyncio.sleep(0.05)  # the ticker's turn: a loop that was blocked shows it now
            ticker.cancel()
            await reader.close()
            return waited, max(gaps), failed

        waited, longest_gap, failed = asyncio.run(stalled_lookup())
        assert failed and 0.9 <= waited < 1.8  # the socket timeout (1 s) ran out, once: a stall is not retried
        assert longest_gap < 0.25, f"the event loop stalled for {longest_gap:.3f}s while the index was stopped"
    finally:
        os.kill(process.pid, signal.SIGCONT)
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.mark.parametrize("url", ["ftp://x", "http://127.0.0.1:6379"])
def test_an_unknown_url_is_refused(url):
    with pytest.raises(ValueError, match="unsupported index URL"):
        create_reader(url, namespace="n")
