"""A fixed pool of KV pages ("blocks") with prefix caching.

Invariants:
  * every block is either in use (ref_count > 0) or in the free queue (ref_count == 0);
  * a free block may still hold a cached hash: it stays reusable (a prefix hit takes it back out
    of the free queue) until it is handed out for new data, which evicts its hash;
  * hash_to_block maps each cached hash to exactly one block.
Eviction order: the free queue is LRU. Freed blocks are appended at the tail; allocation pops
from the head, so the least recently freed cached block is evicted first. A request frees its
blocks in reverse order, so a prefix's tail is evicted before its head (the head is the part
other requests are most likely to share).
Every store and eviction of a published hash is recorded as an event for the global index (a
block's other pages are cached under keys of their own, unpublished: kv_cache_manager.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from shared.block_events import BlockEvicted, BlockStored
from shared.types import BlockHash


@dataclass(slots=True, eq=False)
class KVBlock:
    block_id: int
    ref_count: int = 0
    block_hash: BlockHash | None = None
    published: bool = False  # its hash's store and eviction go to the index
    prev: KVBlock | None = field(default=None, repr=False)
    next: KVBlock | None = field(default=None, repr=False)


class FreeBlockQueue:
    """Doubly linked list of free blocks: O(1) append, pop-left and removal from the middle."""

    def __init__(self, blocks: list[KVBlock]) -> None:
        self._head = KVBlock(-1)
        self._tail = KVBlock(-1)
        self._head.next, self._tail.prev = self._tail, self._head
        self.num_free = 0
        for block in blocks:
            self.append(block)

    def append(self, block: KVBlock) -> None:
        last = self._tail.prev
        assert last is not None
        block.prev, block.next = last, self._tail
        last.next = block
        self._tail.prev = block
        self.num_free += 1

    def popleft(self) -> KVBlock:
        first = self._head.next
        if first is None or first is self._tail:
            raise IndexError("no free blocks")
        self.remove(first)
        return first

    def remove(self, block: KVBlock) -> None:
        if block.prev is None or block.next is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        block.prev.next, block.next.prev = block.next, block.prev
        block.prev = block.next = None
        self.num_free -= 1

    def __iter__(self):
        node = self._head.next
        while node is not None and node is not self._tail:
            yield node
            node = node.next


class BlockPool:
    def __init__(self, num_blocks: int, *, enable_caching: bool = True) -> None:
        if num_blocks <= 0:
            raise ValueError("num_blocks must be positive")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.hash_to_block: dict[BlockHash, KVBlock] = {}
        self.events: list[BlockStored | BlockEvicted] = []
        self.num_evictions = 0  # cached blocks whose hash was dropped to reuse the block, ever
        # Called with each hash the pool drops (a hybrid model's saved state after that block goes with it).
        self.on_evict: Callable[[BlockHash], None] | None = None

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free

    def lookup(self, block_hash: BlockHash) -> KVBlock | None:
        return self.hash_to_block.get(block_hash)

    def touch(self, blocks: list[KVBlock]) -> None:
        """Take a reference on cached blocks (a prefix hit), reviving free ones."""
        for block in blocks:
            if block.ref_count == 0:
                self.free_queue.remove(block)
            block.ref_count += 1

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self.num_free_blocks

    def allocate(self, num_blocks: int) -> list[KVBlock]:
        """Hand out ``num_blocks`` fresh blocks (ref_count 1), evicting their cached hashes."""
        if not self.can_allocate(num_blocks):
            raise ValueError(f"cannot allocate {num_blocks} blocks; {self.num_free_blocks} free")
        out = []
        for _ in range(num_blocks):
            block = self.free_queue.popleft()
            self._evict_hash(block)
            block.ref_count = 1
            out.append(block)
        return out

    def free(self, blocks: list[KVBlock]) -> None:
        """Drop one reference from each block; blocks reaching zero join the free queue's tail in
        the order given (callers pass a request's blocks tail-first)."""
        for block in blocks:
            block.ref_count -= 1
            if block.ref_count < 0:
                raise ValueError(f"block {block.block_id} freed more times than taken")
            if block.ref_count == 0:
                self.free_queue.append(block)

    def cache_block(self, block: KVBlock, block_hash: BlockHash, *, publish: bool = True) -> None:
        """Record that ``block`` holds the full block ``block_hash``."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self.hash_to_block:
            return  # another block already holds identical KV; keep the first
        block.block_hash = block_hash
        block.published = publish
        self.hash_to_block[block_hash] = block
        if publish:
            self.events.append(BlockStored(block_hash, block.block_id))

    def import_block(self, block_hash: BlockHash, *, publish: bool = True) -> KVBlock | None:
        """Take a free block for KV computed elsewhere and file it under ``block_hash`` as a free,
        cached block (at the free queue's tail: the last to be evicted). The caller writes the
        page into it before anything else allocates. None if caching is off or nothing is free."""
        if not self.enable_caching or not self.can_allocate(1):
            return None
        block = self.allocate(1)[0]
        self.cache_block(block, block_hash, publish=publish)
        self.free([block])
        return block

    def drain_events(self) -> list[BlockStored | BlockEvicted]:
        events, self.events = self.events, []
        return events

    def _evict_hash(self, block: KVBlock) -> None:
        if block.block_hash is None:
            return
        if self.hash_to_block.get(block.block_hash) is block:
            del self.hash_to_block[block.block_hash]
        if block.published:
            self.events.append(BlockEvicted(block.block_hash, block.block_id))
        if self.on_evict is not None:
            self.on_evict(block.block_hash)
        self.num_evictions += 1
        block.block_hash = None
        block.published = False
