"""Per-request KV allocation on top of the page pool, with prefix caching, for every KV layout
(kv/layout.py: groups of layers by attention window, each logical block one or more pages).

Prefix lookup walks the request's block hashes from the first and stops at the first block whose
full-attention pages are not all cached; a sliding group then needs only the pages of the blocks
a query after the hit can still read, and the hit shrinks until they are cached too. It never
covers the whole prompt: the last prompt token is always computed, because its logits give the
first output token. A hit may end inside an image's span, also for families whose image tokens
attend both ways (Gemma3), as in vLLM: block hashes carry the image's identity, and an image's KV
is only ever computed with the whole image in one chunk, so a cached block of it holds exactly
what the same image, after the same prefix, computes again. The scheduler then runs the rest of
that image in one chunk too. A hybrid model's hit must also end where its linear layers' state
was saved (``is_state_point``; kv/recurrent_state.py): it shrinks to the last such block, whose
saved state is restored into the request's slot.

Page keys: page j of group g of the block with hash h is cached under h itself for (0, 0) and
under "h|g.j" otherwise; only (0, 0) pages reach the cluster index (a node holds a block when it
holds its full-attention KV).

Sliding groups release a block's pages once it is out of every future window (after each step
and at adoption); released pages join the free queue still cached, so a later prompt that needs
them may hit them. Allocation is all-or-nothing: if the pool cannot supply every page a step
needs, nothing is taken and the caller keeps the request waiting.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.engine.kv.block_pool import BlockPool, KVBlock
from services.engine.kv.layout import KVLayout
from services.engine.kv.recurrent_state import StateSlots, StateSnapshots
from services.engine.request import Request
from shared.block_events import BlockEvicted, BlockStored, StateKept
from shared.types import BlockHash

# A request's pages in one group: per logical block, its pages (one per page index), or None
# once released (a sliding group's block out of every future window).
GroupTable = list[list[KVBlock] | None]


def page_key(block_hash: BlockHash, group: int, page: int) -> BlockHash:
    return block_hash if group == 0 and page == 0 else BlockHash(f"{block_hash}|{group}.{page}")


@dataclass(slots=True)
class CachedPrefix:
    """A prefix hit: ``num_blocks`` leading blocks, and each group's pages for them (None where a
    sliding group needs no page); for a hybrid model, the snapshot of the state at its end."""

    num_blocks: int = 0
    tables: list[GroupTable] = field(default_factory=list)
    state_snapshot: int | None = None

    def __len__(self) -> int:
        return self.num_blocks

    def pages(self) -> list[KVBlock]:
        return [page for table in self.tables for pages in table if pages is not None for page in pages]


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_caching: bool = True,
        layout: KVLayout | None = None,
        max_chunk_tokens: int | None = None,
        state_slots: int = 0,
        state_snapshots: int = 0,
        state_interval_blocks: int | None = None,
    ) -> None:
        """``num_blocks``: pages in the pool. ``max_chunk_tokens``: the most tokens one step
        computes for a request (bounds a sliding group's pages held at once). ``state_slots``: a
        hybrid model's per-request state slots (kv/recurrent_state.py), held with the pages;
        ``state_snapshots``: how many saved states its prefix hits may restore, saved at the
        state points (``is_state_point``, every ``state_interval_blocks`` among them)."""
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self.layout = layout or KVLayout.uniform(1)
        self.max_chunk_tokens = max_chunk_tokens
        self.pool = BlockPool(num_blocks, enable_caching=enable_caching)
        self.req_to_tables: dict[str, list[GroupTable]] = {}
        self._req_to_num_cached: dict[str, int] = {}
        self._num_groups = len(self.layout.groups)
        self.state_slots = StateSlots(state_slots) if state_slots else None
        self.snapshots = StateSnapshots(state_snapshots) if state_slots and state_snapshots and enable_caching else None
        self.state_interval_blocks = state_interval_blocks
        if self.snapshots is not None:  # a saved state is evicted with its block
            self.pool.on_evict = self.snapshots.drop
        # (slot, snapshot) copies the model runner makes: restores before the next step, saves after it.
        self.pending_restores: list[tuple[int, int]] = []
        self.pending_saves: list[tuple[int, int]] = []

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def pages_needed(self, num_tokens: int) -> int:
        """The most pages a request of ``num_tokens`` tokens holds at once (admission)."""
        blocks = self.blocks_needed(num_tokens)
        total = 0
        for g, group in enumerate(self.layout.groups):
            held = blocks
            if group.window is not None and self.max_chunk_tokens is not None:
                held = min(blocks, self.blocks_needed(group.window + self.max_chunk_tokens) + 1)
            total += held * self.layout.pages_per_block(g)
        return total

    def pages_to_adopt(self, num_known_tokens: int, num_tokens: int) -> int:
        """Pages a request adopted with ``num_known_tokens`` computed and room for ``num_tokens``
        takes at once (connector.import_prefilled reserves them all)."""
        blocks = self.blocks_needed(num_tokens)
        return sum(
            max(0, blocks - self.layout.first_needed_block(g, num_known_tokens, self.block_size)) * self.layout.pages_per_block(g)
            for g in range(self._num_groups)
        )

    # -- prefix lookup ---------------------------------------------------------------------------
    def find_cached_prefix(self, request: Request) -> CachedPrefix:
        # A request that reads every prompt position's hidden state (prompt logprobs, CLS or
        # MEAN pooling) computes its whole prompt: a cached prefix's were never kept.
        if not self.pool.enable_caching or request.computes_whole_prompt:
            return CachedPrefix(0, [[] for _ in range(self._num_groups)])
        hashes = request.update_block_hashes(self.block_size)
        return self.cached_prefix(hashes[: (request.num_tokens - 1) // self.block_size])

    def cached_prefix(self, hashes: list[BlockHash]) -> CachedPrefix:
        """The longest leading run of ``hashes`` held here, every page a query after it reads."""
        full = [g for g, group in enumerate(self.layout.groups) if group.window is None]
        num = 0
        for block_hash in hashes:
            if any(self._lookup(block_hash, g) is None for g in full):
                break
            num += 1
        while num > 0 and not (self._window_pages_cached(hashes, num) and self._state_kept(hashes, num)):
            num -= 1
        tables = []
        for g in range(self._num_groups):
            first = self.layout.first_needed_block(g, num * self.block_size, self.block_size)
            tables.append([None if b < first else self._lookup(hashes[b], g) for b in range(num)])
        snapshot = self.snapshots.lookup(hashes[num - 1]) if num and self.snapshots is not None else None
        return CachedPrefix(num, tables, snapshot)

    def _state_kept(self, hashes: list[BlockHash], num: int) -> bool:
        """A hybrid model's hit must end where a state was saved (its KV alone cannot resume it)."""
        if self.state_slots is None:
            return True
        return self.snapshots is not None and self.snapshots.holds(hashes[num - 1])

    def num_cached_blocks(self, hashes: list[BlockHash]) -> int:
        return self.cached_prefix(hashes).num_blocks

    def _window_pages_cached(self, hashes: list[BlockHash], num: int) -> bool:
        for g, group in enumerate(self.layout.groups):
            if group.window is not None:
                first = self.layout.first_needed_block(g, num * self.block_size, self.block_size)
                if any(self._lookup(hashes[b], g) is None for b in range(first, num)):
                    return False
        return True

    def _lookup(self, block_hash: BlockHash, group: int) -> list[KVBlock] | None:
        pages = [self.pool.lookup(page_key(block_hash, group, j)) for j in range(self.layout.pages_per_block(group))]
        return None if any(page is None for page in pages) else pages

    # -- allocation ------------------------------------------------------------------------------
    def can_allocate(self, request: Request, num_new_tokens: int, cached: CachedPrefix | None = None) -> bool:
        if self.state_slots is not None and self.state_slots.needs_slot(request.request_id) and not self.state_slots.num_free:
            return False
        return self._num_pages_to_take(request, num_new_tokens, cached) <= self.pool.num_free_blocks

    def allocate(self, request: Request, num_new_tokens: int, cached: CachedPrefix | None = None) -> bool:
        """Give ``request`` pages for ``num_new_tokens`` more tokens after its computed ones (and
        after ``cached``, a prefix hit being adopted). A sliding group gets no page for blocks
        already out of every future window. Returns False, changing nothing, if the pool cannot
        supply them."""
        if not self.can_allocate(request, num_new_tokens, cached):
            return False
        if self.state_slots is not None:
            slot = self.state_slots.take(request.request_id)
            if cached is not None and cached.state_snapshot is not None:
                self.pending_restores.append((slot, cached.state_snapshot))
        tables = self.req_to_tables.setdefault(request.request_id, [[] for _ in range(self._num_groups)])
        if cached is not None and cached.num_blocks:
            self.pool.touch(cached.pages())
            for table, cached_table in zip(tables, cached.tables):
                table.extend(cached_table)
            self._req_to_num_cached[request.request_id] = cached.num_blocks
        start = request.num_computed_tokens + (cached.num_blocks if cached is not None else 0) * self.block_size
        num_blocks = self.blocks_needed(start + num_new_tokens)
        for g, table in enumerate(tables):
            first = self.layout.first_needed_block(g, start, self.block_size)
            for b in range(len(table), num_blocks):
                table.append(None if b < first else self.pool.allocate(self.layout.pages_per_block(g)))
        return True

    def _num_pages_to_take(self, request: Request, num_new_tokens: int, cached: CachedPrefix | None) -> int:
        tables = self.req_to_tables.get(request.request_id)
        num_cached = cached.num_blocks if cached is not None else 0
        start = request.num_computed_tokens + num_cached * self.block_size
        num_blocks = self.blocks_needed(start + num_new_tokens)
        fresh = 0
        for g in range(self._num_groups):
            held = (len(tables[g]) if tables else 0) + num_cached
            first = self.layout.first_needed_block(g, start, self.block_size)
            fresh += max(0, num_blocks - max(held, first)) * self.layout.pages_per_block(g)
        revived = sum(1 for page in cached.pages() if page.ref_count == 0) if cached is not None else 0
        return fresh + revived

    # -- after a step ----------------------------------------------------------------------------
    def cache_computed_blocks(self, request: Request) -> None:
        """File every block whose tokens are all computed under its hash, then release the
        sliding groups' blocks out of every future window."""
        tables = self.req_to_tables.get(request.request_id)
        if not tables:
            return
        num_full = min(request.num_computed_tokens // self.block_size, len(tables[0]))
        start = self._req_to_num_cached.get(request.request_id, 0)
        if num_full > start:
            hashes = request.update_block_hashes(self.block_size)
            for b in range(start, min(num_full, len(hashes))):
                for g, table in enumerate(tables):
                    for j, page in enumerate(table[b] or ()):
                        self.pool.cache_block(page, page_key(hashes[b], g, j), publish=(g, j) == (0, 0))
            self._req_to_num_cached[request.request_id] = min(num_full, len(hashes))
        self._save_state(request)
        self._release_out_of_window(request, tables)

    # -- a hybrid model's state ------------------------------------------------------------------
    def is_state_point(self, request: Request, num_blocks: int) -> bool:
        """Whether the state after ``num_blocks`` blocks of ``request`` is saved: at the end of the
        prompt's last full block (what a repeat, or the next turn, reuses at most), at the last
        block end within each image (a question about the same image reuses the image), and every
        ``state_interval_blocks`` blocks (long shared prefixes)."""
        if num_blocks <= 0:
            return False
        if num_blocks == (request.num_prompt_tokens - 1) // self.block_size:
            return True
        if self.state_interval_blocks and num_blocks % self.state_interval_blocks == 0:
            return True
        return any(feature.placeholder.end // self.block_size == num_blocks for feature in request.mm_features)

    def tokens_to_state_point(self, request: Request, start: int) -> int | None:
        """Tokens from ``start`` to the next state point within the prompt, where a prefill chunk
        must stop so that the state there can be saved; None when none is ahead (or nothing is saved)."""
        if self.snapshots is None:
            return None
        last = (request.num_prompt_tokens - 1) // self.block_size
        for num_blocks in range(start // self.block_size + 1, last + 1):
            if self.is_state_point(request, num_blocks):
                return num_blocks * self.block_size - start
        return None

    def _save_state(self, request: Request) -> None:
        """After a step: a request standing at a state point has its state saved under that block."""
        if self.snapshots is None or request.num_computed_tokens % self.block_size:
            return
        num_blocks = request.num_computed_tokens // self.block_size
        if not self.is_state_point(request, num_blocks):
            return
        hashes = request.update_block_hashes(self.block_size)
        if num_blocks > len(hashes):
            return
        snapshot = self.snapshots.save(hashes[num_blocks - 1])
        if snapshot is not None:
            self.pending_saves.append((self.state_slot(request), snapshot))

    def _release_out_of_window(self, request: Request, tables: list[GroupTable]) -> None:
        for g, table in enumerate(tables):
            first = self.layout.first_needed_block(g, request.num_computed_tokens, self.block_size)
            for b in range(min(first, len(table))):
                if table[b] is not None:
                    self.pool.free(table[b])
                    table[b] = None

    def free(self, request: Request) -> None:
        tables = self.req_to_tables.pop(request.request_id, [])
        self._req_to_num_cached.pop(request.request_id, None)
        if self.state_slots is not None:
            self.state_slots.release(request.request_id)
        # Tail first, so the shared head of a prefix is the last to be evicted.
        for table in reversed(tables):
            self.pool.free([page for pages in reversed(table) if pages is not None for page in reversed(pages)])

    # -- events for the cluster index -------------------------------------------------------------
    def drain_events(self) -> list[BlockStored | BlockEvicted | StateKept]:
        """The pool's events since the last call; for a hybrid model, then, for every published
        block stored or whose saved state came or went, whether its state is kept (a block held
        without it is no place for another node's prefix to resume)."""
        events: list[BlockStored | BlockEvicted | StateKept] = list(self.pool.drain_events())
        if self.state_slots is None:
            return events
        changed = dict.fromkeys(event.block_hash for event in events if isinstance(event, BlockStored))
        changed.update(dict.fromkeys(self.snapshots.drain_changes() if self.snapshots is not None else ()))
        for block_hash in changed:
            block = self.pool.lookup(block_hash)
            if block is not None and block.published:
                events.append(StateKept(block_hash, self.snapshots is not None and self.snapshots.holds(block_hash)))
        return events

    # -- tables ----------------------------------------------------------------------------------
    def page_table(self, request: Request, group: int = 0, page: int = 0, *, fill: int | None = 0) -> list[int | None]:
        """Page ids of one (group, page) column for each logical block; released blocks read as
        ``fill`` (attention masks them out; a reader of pages skips None)."""
        tables = self.req_to_tables.get(request.request_id)
        if not tables:
            return []
        return [fill if pages is None else pages[page].block_id for pages in tables[group]]

    def state_slot(self, request: Request) -> int:
        """The state slot of a request holding pages (hybrid models only)."""
        if self.state_slots is None:
            raise RuntimeError("this model keeps no per-request state")
        return self.state_slots.slot_of(request.request_id)

    def block_table(self, request: Request) -> list[int]:
        """Group 0's first page of each block: the whole block in a uniform layout."""
        return self.page_table(request)
