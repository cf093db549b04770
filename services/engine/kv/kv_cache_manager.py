"""Per-request KV allocation on top of the block pool, with prefix caching.

Prefix lookup walks the request's block hashes from the first and stops at the first miss. It
never covers the whole prompt: the last prompt token is always computed, because its logits give
the first output token. A hit may end inside an image's span, also for families whose image tokens
attend both ways (Gemma3), as in vLLM: block hashes carry the image's identity, and an image's KV is
only ever computed with the whole image in one chunk, so a cached block of it holds exactly what
the same image, after the same prefix, computes again. The scheduler then runs the rest of that
image in one chunk too.
Allocation is all-or-nothing: if the pool cannot supply every block a step needs, nothing is
taken and the caller keeps the request waiting.
"""

from __future__ import annotations

from services.engine.kv.block_pool import BlockPool, KVBlock
from services.engine.request import Request


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, *, enable_caching: bool = True) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, enable_caching=enable_caching)
        self.req_to_blocks: dict[str, list[KVBlock]] = {}
        self._req_to_num_cached: dict[str, int] = {}

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def find_cached_prefix(self, request: Request) -> list[KVBlock]:
        if not self.pool.enable_caching:
            return []
        hashes = request.update_block_hashes(self.block_size)
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVBlock] = []
        for block_hash in hashes[:max_blocks]:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def can_allocate(self, request: Request, num_new_tokens: int, cached: list[KVBlock] = ()) -> bool:
        return self._num_blocks_to_take(request, num_new_tokens, cached) <= self.pool.num_free_blocks

    def allocate(self, request: Request, num_new_tokens: int, cached: list[KVBlock] = ()) -> bool:
        """Give ``request`` slots for ``num_new_tokens`` more tokens after its computed ones (and
        after ``cached``, a prefix hit being adopted). Returns False, changing nothing, if the
        pool cannot supply them."""
        if not self.can_allocate(request, num_new_tokens, cached):
            return False
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        if cached:
            self.pool.touch(list(cached))
            blocks.extend(cached)
            self._req_to_num_cached[request.request_id] = len(blocks)
        total_tokens = request.num_computed_tokens + len(cached) * self.block_size + num_new_tokens
        num_fresh = self.blocks_needed(total_tokens) - len(blocks)
        if num_fresh > 0:
            blocks.extend(self.pool.allocate(num_fresh))
        return True

    def cache_computed_blocks(self, request: Request) -> None:
        """Publish every block whose tokens are all computed under its hash."""
        blocks = self.req_to_blocks.get(request.request_id, [])
        num_full = min(request.num_computed_tokens // self.block_size, len(blocks))
        start = self._req_to_num_cached.get(request.request_id, 0)
        if num_full <= start:
            return
        hashes = request.update_block_hashes(self.block_size)
        for index in range(start, min(num_full, len(hashes))):
            self.pool.cache_block(blocks[index], hashes[index])
        self._req_to_num_cached[request.request_id] = min(num_full, len(hashes))

    def free(self, request: Request) -> None:
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self._req_to_num_cached.pop(request.request_id, None)
        # Tail first, so the shared head of a prefix is the last to be evicted.
        self.pool.free(list(reversed(blocks)))

    def block_table(self, request: Request) -> list[int]:
        return [block.block_id for block in self.req_to_blocks.get(request.request_id, [])]

    def _num_blocks_to_take(self, request: Request, num_new_tokens: int, cached: list[KVBlock]) -> int:
        held = len(self.req_to_blocks.get(request.request_id, [])) + len(cached)
        total_tokens = request.num_computed_tokens + len(cached) * self.block_size + num_new_tokens
        fresh = max(0, self.blocks_needed(total_tokens) - held)
        revived = sum(1 for block in cached if block.ref_count == 0)
        return fresh + revived
