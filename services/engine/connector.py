"""Moving work between engines on different nodes: embeddings computed by an encoder node, and
KV pages computed by a prefill node or held by a peer. The Engine itself only adds, aborts and
steps requests; these functions run on its thread (through EngineLoop.call) and touch its caches
directly. Pages are in the format of kv_pages.py.
"""

from __future__ import annotations

import torch

from services.engine.engine import Engine, RequestRejectedError
from services.engine.kv.kv_cache_manager import page_key
from services.engine.kv_pages import KVPages
from services.engine.request import Request
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
    Every page it may ever need is reserved now, so it can never be preempted (a decode node
    could not recompute a prompt whose images it does not hold). Blocks a sliding layer can no
    longer read get no page there (the sender's were released; it sends zeros for them).

    A migrated request arrives with ``output_token_ids`` also holding the answer sent before the
    migration: ``pages`` then cover the prompt and those tokens, the first token excepted. A hybrid
    model's pages carry the request's state after those same tokens, copied into its slot.
    """
    num_state_layers = len(engine.runner.states) if engine.runner.states is not None else 0
    if len(pages.states) != num_state_layers:
        # A hybrid model's state after the same tokens: without it the request cannot go on.
        raise RequestRejectedError(f"the request's KV pages carry state for {len(pages.states)} layers; this model has {num_state_layers}")
    engine.start_grammar(request)
    num_known_tokens = request.num_tokens - 1  # all but the first token have KV in the pages
    request.num_computed_tokens = num_known_tokens
    total = request.num_prompt_tokens + request.sampling.max_tokens
    if not engine.kv.allocate(request, max(0, total - num_known_tokens)):
        request.num_computed_tokens = 0
        engine.grammars.forget(request.request_id)
        raise KVPagesExhaustedError("decode node has no free KV pages for this request; retry later")
    for layer, (k_pages, v_pages) in zip(engine.kv.layout.kv_layers, pages.layers):
        ids, kept = _layer_pages(engine, request, layer, pages.num_blocks)
        k_cache, v_cache = engine.runner.kv_caches[engine.kv.layout.place(layer).slot]
        k_cache.index_copy_(0, ids, k_pages[kept].to(k_cache.device, k_cache.dtype))
        v_cache.index_copy_(0, ids, v_pages[kept].to(v_cache.device, v_cache.dtype))
    if engine.runner.states is not None:
        slot = engine.kv.state_slot(request)
        for (conv, recurrent), (conv_in, recurrent_in) in zip(engine.runner.states, pages.states):
            conv[slot].copy_(conv_in)
            recurrent[slot].copy_(recurrent_in)
        _file_snapshot(engine, request.update_block_hashes(engine.kv.block_size), pages.prefix_blocks, pages.prefix_states)
    engine.kv.cache_computed_blocks(request)
    engine.requests[request.request_id] = request
    engine.scheduler.adopt(request)


def _layer_pages(engine: Engine, request: Request, layer: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(page ids, indices among the first ``count`` blocks) of the blocks holding a page for
    ``layer``: released sliding blocks have none."""
    place = engine.kv.layout.place(layer)
    table = engine.kv.page_table(request, place.group, place.page, fill=None)[:count]
    kept = [b for b, page in enumerate(table) if page is not None]
    device = engine.runner.device
    return torch.tensor([table[b] for b in kept], dtype=torch.long, device=device), torch.tensor(kept, dtype=torch.long)


def read_request_pages(engine: Engine, request: Request, count: int) -> KVPages:
    """Copies of the first ``count`` blocks' pages of ``request``, every KV layer, and a hybrid
    model's state of the request as it stands; a block a sliding layer released reads as zeros
    (no query after the prompt reads it)."""
    layers = []
    for layer in engine.kv.layout.kv_layers:
        ids, kept = _layer_pages(engine, request, layer, count)
        layers.append(_gather(engine, layer, ids, kept, count))
    if engine.runner.states is None:
        return KVPages(layers)
    slot = engine.kv.state_slot(request)
    pages = KVPages(layers, [(conv[slot].clone(), recurrent[slot].clone()) for conv, recurrent in engine.runner.states])
    # The state saved at the prompt's last full block, if still held: the receiver's prefix hits.
    engine.runner.save_states(engine.kv)
    prefix_blocks = min(count, (request.num_prompt_tokens - 1) // engine.kv.block_size)
    hashes = request.update_block_hashes(engine.kv.block_size)
    snapshot = engine.kv.snapshots.lookup(hashes[prefix_blocks - 1]) if prefix_blocks and engine.kv.snapshots is not None else None
    if snapshot is not None and engine.runner.snapshots is not None:
        pages.prefix_states = [(conv[snapshot].clone(), recurrent[snapshot].clone()) for conv, recurrent in engine.runner.snapshots]
        pages.prefix_blocks = prefix_blocks
    return pages


def _gather(engine: Engine, layer: int, ids: torch.Tensor, kept: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    k_cache, v_cache = engine.runner.kv_caches[engine.kv.layout.place(layer).slot]
    out = []
    for cache in (k_cache, v_cache):
        pages = cache.new_zeros((count, *cache.shape[1:]))
        pages[kept.to(cache.device)] = cache.index_select(0, ids)
        out.append(pages)
    return out[0], out[1]


def num_cached_blocks(engine: Engine, hashes: list[BlockHash]) -> int:
    """How many leading blocks of ``hashes`` a prefix hit here would reuse."""
    return engine.kv.num_cached_blocks(hashes)


def export_prefix(engine: Engine, hashes: list[BlockHash]) -> KVPages:
    """Pages of the leading blocks of ``hashes`` held here (no blocks if none is held): what a
    prefix hit would reuse, a sliding layer's blocks before its last window as zeros, and for a
    hybrid model the state saved at the hit's end."""
    if engine.runner.states is not None:
        engine.runner.save_states(engine.kv)  # a snapshot saved after the last step is written now
    cached = engine.kv.cached_prefix(hashes)
    layers = []
    for layer in engine.kv.layout.kv_layers:
        place = engine.kv.layout.place(layer)
        table = cached.tables[place.group] if cached.tables else []
        kept = [b for b, held in enumerate(table) if held is not None]
        ids = torch.tensor([table[b][place.page].block_id for b in kept], dtype=torch.long, device=engine.runner.device)
        layers.append(_gather(engine, layer, ids, torch.tensor(kept, dtype=torch.long), cached.num_blocks))
    states = []
    if cached.state_snapshot is not None and engine.runner.snapshots is not None:
        # A hybrid model's hit ends where a state was saved: the state travels with the pages.
        at = cached.state_snapshot
        states = [(conv[at].clone(), recurrent[at].clone()) for conv, recurrent in engine.runner.snapshots]
    return KVPages(layers, states)


def import_blocks(engine: Engine, hashes: list[BlockHash], pages: KVPages) -> int:
    """File pages computed elsewhere under their block hashes as cached prefix blocks, so the next
    prefix lookup finds them (a sliding layer's only for the blocks a query after the run reads,
    the rule export_prefix applies). Pages already held are skipped; stops when the pool has no
    free page. Returns the number of blocks that gained a page."""
    kv, layout = engine.kv, engine.kv.layout
    count = min(len(hashes), pages.num_blocks)
    if engine.runner.states is not None:
        # A hybrid model's blocks serve a hit only with the state at their end: none, none filed.
        if not pages.states or count < pages.num_blocks or not _file_snapshot(engine, hashes, count, pages.states):
            return 0
    index_of = {layer: i for i, layer in enumerate(layout.kv_layers)}
    num_imported = 0
    for b in range(count):
        imported = False
        for g, j in layout.columns:
            if b < layout.first_needed_block(g, count * kv.block_size, kv.block_size):
                continue
            key = page_key(hashes[b], g, j)
            if kv.pool.lookup(key) is not None:
                continue
            page = kv.pool.import_block(key, publish=(g, j) == (0, 0))
            if page is None:
                return num_imported
            for slot in range(layout.num_slots):
                layer = layout.groups[g].layers[j * layout.num_slots + slot]
                k_cache, v_cache = engine.runner.kv_caches[slot]
                k_cache[page.block_id].copy_(pages.layers[index_of[layer]][0][b])
                v_cache[page.block_id].copy_(pages.layers[index_of[layer]][1][b])
            imported = True
        num_imported += imported
    return num_imported


def _file_snapshot(engine: Engine, hashes: list[BlockHash], num_blocks: int, states: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    """Keep ``states``, a hybrid request's state after its first ``num_blocks`` blocks, for prefix
    hits; False when there is none or nowhere to keep it."""
    snapshots = engine.runner.snapshots
    if not states or not num_blocks or num_blocks > len(hashes) or snapshots is None or engine.kv.snapshots is None:
        return False
    engine.runner.save_states(engine.kv)  # pending saves first: this one may take a snapshot they name
    snapshot = engine.kv.snapshots.save(hashes[num_blocks - 1])
    if snapshot is None:
        return False
    for (conv, recurrent), (conv_in, recurrent_in) in zip(snapshots, states):
        conv[snapshot].copy_(conv_in)
        recurrent[snapshot].copy_(recurrent_in)
    return True
