"""Block pool invariants under random workloads."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.engine.kv.block_pool import BlockEvicted, BlockPool, BlockStored, FreeBlockQueue, KVBlock
from shared.types import BlockHash


def test_free_queue_supports_o1_removal_from_the_middle():
    blocks = [KVBlock(i) for i in range(5)]
    queue = FreeBlockQueue(blocks)
    queue.remove(blocks[2])
    assert [b.block_id for b in queue] == [0, 1, 3, 4] and queue.num_free == 4
    assert queue.popleft().block_id == 0
    queue.append(blocks[2])
    assert [b.block_id for b in queue] == [1, 3, 4, 2]


def test_freed_cached_blocks_stay_reusable_until_evicted_in_lru_order():
    pool = BlockPool(3)
    a, b, c = pool.allocate(3)
    for block, name in ((a, "a"), (b, "b"), (c, "c")):
        pool.cache_block(block, BlockHash(name))
    pool.free([c, b, a])  # tail first: a is freed last
    assert pool.lookup(BlockHash("a")) is a
    pool.touch([a])  # a prefix hit revives a
    [fresh] = pool.allocate(1)  # evicts the least recently freed: c
    assert fresh is c and pool.lookup(BlockHash("c")) is None and pool.lookup(BlockHash("b")) is b
    events = pool.drain_events()
    assert BlockStored(BlockHash("a"), a.block_id) in events and events[-1] == BlockEvicted(BlockHash("c"), c.block_id)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "free", "cache", "touch"]), st.integers(1, 6), st.integers(0, 20)), max_size=80))
def test_pool_never_exceeds_its_blocks_and_counts_stay_consistent(ops):
    num_blocks = 8
    pool = BlockPool(num_blocks)
    held: list[KVBlock] = []
    for op, n, key in ops:
        if op == "alloc":
            if pool.can_allocate(n):
                held.extend(pool.allocate(n))
            else:
                assert n > pool.num_free_blocks
        elif op == "free" and held:
            pool.free([held.pop()])
        elif op == "cache" and held:
            pool.cache_block(held[key % len(held)], BlockHash(f"h{key}"))
        elif op == "touch":
            block = pool.lookup(BlockHash(f"h{key}"))
            if block is not None:
                pool.touch([block])
                held.append(block)
        in_use = [b for b in pool.blocks if b.ref_count > 0]
        assert len(in_use) + pool.num_free_blocks == num_blocks
        assert sum(b.ref_count for b in pool.blocks) == len(held)
        assert all(pool.hash_to_block[h].block_hash == h for h in pool.hash_to_block)
        assert len(list(pool.free_queue)) == pool.num_free_blocks


def test_import_block_files_a_free_cached_block_at_the_queue_tail():
    pool = BlockPool(3)
    block = pool.import_block(BlockHash("h1"))
    assert block is not None
    assert block.ref_count == 0 and pool.lookup(BlockHash("h1")) is block
    assert pool.num_free_blocks == 3
    assert list(pool.free_queue)[-1] is block  # evicted last
    first = pool.allocate(1)[0]
    assert first is not block and pool.lookup(BlockHash("h1")) is block


def test_import_block_returns_none_when_nothing_is_free():
    pool = BlockPool(1)
    pool.allocate(1)
    assert pool.import_block(BlockHash("h1")) is None
    assert pool.lookup(BlockHash("h1")) is None
