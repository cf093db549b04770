"""Moving work between engines on different nodes: embeddings computed by an encoder node, and
KV pages computed by a prefill node or held by a peer. The Engine itself only adds, aborts and
steps requests; these functions run on its thread (through EngineLoop.call) and touch its caches
directly. Pages are in the format of kv_pages.py.
"""

from __future__ import annotations

import torch

from services.engine.engine import Engine, RequestRejectedError
from services.engine.kv_pages import KVPages, num_blocks
from services.engine.request import Request, RequestStatus
from shared.types import BlockHash, MmHash


class KVPagesExhaustedError(RequestRejectedError):
    """No free KV pages for the request right now: the node is busy, the request is fine."""


def import_embeddings(engine: Engine, request_id: str, mm_hash: MmHash, embeds: torch.Tensor) -> bool:
    """Make an image's embeddings resident for ``request_id`` (computed elsewhere). Returns False
    if the encoder cache has no room right now."""
    cache = engine.encoder_cache
    if cache.check_and_update_cache(request_id, mm_hash):
        return True
    if not cache.can_allocate(embeds.shape[0]):
        return False
    cache.allocate(request_id, mm_hash, embeds.shape[0])
    engine.runner.encoder_outputs[mm_hash] = embeds.to(engine.runner.device, engine.runner.dtype)
    engine.sync_encoder_outputs()
    return True


def import_prefilled(engine: Engine, request: Request, pages: KVPages) -> None:
    """Adopt a request whose prompt KV was computed elsewhere. Its first token (sampled where the
    prompt was prefilled) is already the last of ``output_token_ids`` and did not finish it.
    Every block it may ever need is reserved now, so it can never be preempted (a decode node
    could not recompute a prompt whose images it does not hold).

    A migrated request arrives with ``output_token_ids`` also holding the answer sent before the
    migration: ``pages`` then cover the prompt and those tokens, the first token excepted.
    """
    num_known_tokens = request.num_tokens - 1  # all but the first token have KV in the pages
    if not engine.kv.allocate(request, request.num_prompt_tokens + request.sampling.max_tokens):
        raise KVPagesExhaustedError("decode node has no free KV pages for this request; retry later")
    table = engine.kv.block_table(request)
    ids = torch.tensor(table[: num_blocks(pages)], dtype=torch.long, device=engine.runner.device)
    for (k_cache, v_cache), (k_pages, v_pages) in zip(engine.runner.kv_caches, pages):
        k_cache.index_copy_(0, ids, k_pages.to(k_cache.device, k_cache.dtype))
        v_cache.index_copy_(0, ids, v_pages.to(v_cache.device, v_cache.dtype))
    request.num_computed_tokens = num_known_tokens
    engine.kv.cache_computed_blocks(request)
    request.status = RequestStatus.RUNNING
    engine.requests[request.request_id] = request
    engine.scheduler.running.append(request)


def read_pages(engine: Engine, block_ids: list[int]) -> KVPages:
    """Copies of these blocks' pages, every layer."""
    ids = torch.tensor(block_ids, dtype=torch.long, device=engine.runner.device)
    return [(k.index_select(0, ids), v.index_select(0, ids)) for k, v in engine.runner.kv_caches]


def num_cached_blocks(engine: Engine, hashes: list[BlockHash]) -> int:
    """How many leading blocks of ``hashes`` the engine's prefix cache holds."""
    count = 0
    for block_hash in hashes:
        if engine.kv.pool.lookup(block_hash) is None:
            break
        count += 1
    return count


def export_prefix(engine: Engine, hashes: list[BlockHash]) -> KVPages:
    """Pages of the leading blocks of ``hashes`` held here (no blocks if none is held)."""
    num = num_cached_blocks(engine, hashes)
    return read_pages(engine, [engine.kv.pool.lookup(h).block_id for h in hashes[:num]])


def import_blocks(engine: Engine, hashes: list[BlockHash], pages: KVPages) -> int:
    """File pages computed elsewhere under their block hashes as cached prefix blocks, so the next
    prefix lookup finds them. Blocks already held are skipped; stops when the pool has no free
    block. Returns the number of blocks imported."""
    num_imported = 0
    for index, block_hash in enumerate(hashes):
        if engine.kv.pool.lookup(block_hash) is not None:
            continue
        block = engine.kv.pool.import_block(block_hash)
        if block is None:
            break
        for (k_cache, v_cache), (k_pages, v_pages) in zip(engine.runner.kv_caches, pages):
            k_cache[block.block_id].copy_(k_pages[index])
            v_cache[block.block_id].copy_(v_pages[index])
        num_imported += 1
    return num_imported
