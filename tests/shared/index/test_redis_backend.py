"""Lookups through redis-py's clients, blocking (RedisIndex, the nodes') and awaited (RedisReader,
the gateway's): each answers the same when the server forgets the script or drops the
connection, and concurrent lookups each get their own answer."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest
import redis

from shared.index.backend import IndexCredentials
from shared.index.redis_backend import RedisIndex
from shared.index.redis_reader import RedisReader
from shared.index.types import IndexEvents, MmEntry, NodeInfo
from shared.types import BlockHash, MmHash
from tests.redis_servers import running_server, valkey_binary

ENTRY = MmEntry(4, (1, 2, 2), 64)
HASHES = [BlockHash(f"b{i}") for i in range(8)]


@pytest.fixture(scope="module")
def url():
    with running_server(valkey_binary()) as url:
        yield url


@pytest.fixture()
def index(url):
    index = RedisIndex(url, namespace=f"test-{uuid.uuid4().hex[:8]}", credentials=IndexCredentials())
    epoch = index.register_node(NodeInfo("pf", "prefill", "pf:1"), ttl_s=30)
    index.publish("pf", epoch, IndexEvents(mm_stored={MmHash("m"): ENTRY}, kv_stored=dict.fromkeys(HASHES[:5], "device")))
    yield index
    index.close()


def answer(index: RedisIndex) -> tuple:
    result = index.lookup([MmHash("m")], HASHES)
    return result.node_to_epoch, result.mm_holders, result.node_to_num_prefix_blocks


def test_a_lookup_loads_the_script_again_when_the_server_forgot_it(index, url):
    expected = answer(index)
    assert expected[2] == {"pf": 5}
    redis.Redis.from_url(url).script_flush()
    assert answer(index) == expected


def test_a_lookup_whose_connection_the_server_dropped_connects_again(index, url):
    expected = answer(index)
    admin = redis.Redis.from_url(url)
    assert admin.client_kill_filter(_type="normal", skipme=True) >= 1  # every client but this one
    assert answer(index) == expected


def test_lookups_from_several_threads_at_once_each_get_their_own_answer(index):
    expected = answer(index)
    answers: list[tuple] = []

    def look_up() -> None:
        for _ in range(50):
            answers.append(answer(index))

    threads = [threading.Thread(target=look_up) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(answers) == 200 and all(a == expected for a in answers)


def test_an_awaited_lookup_survives_a_forgotten_script_and_a_dropped_connection(index, url):
    expected = answer(index)
    reader = RedisReader(url, namespace=index.namespace, credentials=IndexCredentials())

    async def answers() -> list[tuple]:
        async def one() -> tuple:
            result = await reader.lookup([MmHash("m")], HASHES)
            return result.node_to_epoch, result.mm_holders, result.node_to_num_prefix_blocks

        try:
            first = await one()
            redis.Redis.from_url(url).script_flush()
            second = await one()
            assert redis.Redis.from_url(url).client_kill_filter(_type="normal", skipme=True) >= 1
            third = await one()
            return [first, second, third, *await asyncio.gather(*(one() for _ in range(20)))]
        finally:
            await reader.close()

    assert all(a == expected for a in asyncio.run(answers()))
