"""What each layer's attention reads in one step: its KV storage and the batch of page tables of
its (group, page) column (services/engine/kv/layout.py). Columns share the step's query layout,
context lengths and image spans; only the page ids differ. Each batch is planned once per step by
the backend and read by every layer of its column. A hybrid decoder's state layers read instead
their state storage and the step's StateBatch (services/engine/kv/recurrent_state.py)."""

from __future__ import annotations

import math
import mmap

import torch

from kernels.attention import AttentionBackend, AttentionBatch
from kernels.gated_delta import StateBatch, StateRun
from services.engine.kv.kv_cache_manager import KVCacheManager
from services.engine.kv.layout import KVLayout
from services.engine.kv.recurrent_state import StateStorage
from services.engine.scheduler import SchedulerOutput
from services.models.family import TextShape

KVCache = tuple[torch.Tensor, torch.Tensor]


def new_kv_storage(layout: KVLayout, num_pages: int, block_size: int, shape: TextShape, dtype, device) -> list[KVCache]:
    """One (K, V) tensor pair per page slot, each (num_pages, block_size, kv_heads, head_dim),
    all zeros. On a CPU they are views of one anonymous mapping: the kernel hands out its pages
    zeroed as they are first written, so the budget is reserved, not written, at start-up (a
    zero fill of the whole budget took a node seconds and made it resident at once)."""
    dims = (num_pages, block_size, shape.num_kv_heads, shape.head_dim)
    num_tensors = 2 * layout.num_slots
    if torch.device(device).type != "cpu":
        flat = torch.zeros((num_tensors, *dims), dtype=dtype, device=device)
    else:
        item_bytes = torch.empty((), dtype=dtype).element_size()
        region = mmap.mmap(-1, max(1, num_tensors * math.prod(dims) * item_bytes))
        flat = torch.frombuffer(region, dtype=torch.uint8).view(dtype).view(num_tensors, *dims)
    return [(flat[2 * slot], flat[2 * slot + 1]) for slot in range(layout.num_slots)]


def layer_attention_inputs(
    step: SchedulerOutput,
    kv: KVCacheManager,
    storage: list[KVCache],
    backend: AttentionBackend,
    shape: TextShape,
    spans: list[list[tuple[int, int]]] | None,
    states: StateStorage | None = None,
) -> list[tuple[KVCache, AttentionBatch] | tuple[tuple[torch.Tensor, torch.Tensor], StateBatch]]:
    """Per decoder layer, in order: (its KV storage, its column's planned batch), or for a state
    layer (its state storage, the step's StateBatch)."""
    layout, block_size = kv.layout, kv.block_size
    device = storage[0][0].device
    query_start_loc, context_lens = [0], []
    for item in step.scheduled:
        query_start_loc.append(query_start_loc[-1] + item.num_new_tokens)
        context_lens.append(item.request.num_computed_tokens + item.num_new_tokens)
    column_to_batch: dict[tuple[int, int], AttentionBatch] = {}
    for group, page in layout.columns:
        tables, slots = [], []
        for item in step.scheduled:
            request = item.request
            table = kv.page_table(request, group, page)
            start, end = request.num_computed_tokens, request.num_computed_tokens + item.num_new_tokens
            slots.extend(table[t // block_size] * block_size + t % block_size for t in range(start, end))
            tables.append(table)
        batch = AttentionBatch(
            query_start_loc=query_start_loc,
            context_lens=context_lens,
            block_tables=tables,
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
            block_size=block_size,
            bidirectional_spans=spans,
        )
        backend.prepare(batch, num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim)
        column_to_batch[(group, page)] = batch
    state_of: dict[int, tuple[tuple[torch.Tensor, torch.Tensor], StateBatch]] = {}
    if shape.state is not None and states is not None:
        runs = [StateRun(query_start_loc[i], item.num_new_tokens, kv.state_slot(item.request)) for i, item in enumerate(step.scheduled)]
        state_batch = StateBatch.of(runs, device)
        state_of = {layer: (states[i], state_batch) for i, layer in enumerate(shape.state.layers)}
    out = []
    for layer in range(shape.num_layers):
        if layer in state_of:
            out.append(state_of[layer])
            continue
        place = layout.place(layer)
        out.append((storage[place.slot], column_to_batch[(place.group, place.page)]))
    return out
