"""PyTorch reference attention over the paged KV cache (CPU and GPU).

Prefill rows (a request with several new tokens): per request, gather its context K/V through
the block table and run scaled-dot-product attention (grouped-query heads shared natively) with
a causal mask aligned to the end of the context (new token j of n sits at absolute position
context_len - n + j).

Decode rows (one new token): batched. A per-request loop costs a few torch calls per request per
layer, which at a few hundred streams is most of a decode step (300 streams of the tiny model:
about 10,000 small calls a step). Decode requests are sorted by context length and cut into
groups; each group is one gather of its blocks padded to the group's longest context and one
SDPA call whose mask hides each row's padding. A group closes when padding would more than double
its gathered keys, or they would pass MAX_GROUP_KEYS rows (the gather's memory bound).
The plan (groups, block indices, masks) is made once per step and batch in ``prepare``, kept on
the batch, and shared by all layers reading that batch; a sliding window's masks are derived from
it once per step and window size. (A model whose layers read different page tables, sliding and
full ones, has one batch per table: services/engine/kv/layout.py.)

Masks (kernels/attention.py): a prefill row's mask is causal, OR'd with its bidirectional spans;
a sliding-window layer then ANDs in k > q - W. A decode row is one text token: causal, and the
window keeps its last W keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.attention import AttentionBatch

MAX_GROUP_KEYS = 65536  # padded keys one decode group may gather (per layer, for K and V each)


@dataclass(slots=True)
class _DecodeGroup:
    rows: torch.Tensor  # [B] query rows of the group's requests
    blocks: torch.Tensor  # [B, max_blocks] block ids, padded with each row's first block
    mask: torch.Tensor  # [B, 1, 1, max_blocks * block_size] True where the key is in context


@dataclass(slots=True)
class _PrefillRow:
    start: int
    end: int
    context_len: int
    blocks: torch.Tensor  # the request's block ids covering its context
    mask: torch.Tensor  # [num_new, context_len] True where the key is visible (sliding window aside)
    plain_causal: bool  # the whole context is new and no span widens the mask: is_causal says it all


@dataclass(slots=True)
class _Plan:
    gqa: bool  # several query heads share each KV head
    prefill_rows: list[_PrefillRow]
    decode_groups: list[_DecodeGroup]
    window_masks: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]]  # W -> (prefill, decode)


class TorchReferenceBackend:
    name = "torch"

    def prepare(self, batch: AttentionBatch, *, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        device = batch.slot_mapping.device
        decodes: list[int] = []
        prefill_rows: list[_PrefillRow] = []
        for i in range(batch.num_reqs):
            start, end, ctx = batch.query_start_loc[i], batch.query_start_loc[i + 1], batch.context_lens[i]
            spans = batch.bidirectional_spans[i] if batch.bidirectional_spans is not None else []
            if end - start == 1 and not any(lo < ctx <= hi for lo, hi in spans):
                decodes.append(i)
                continue
            blocks = torch.tensor(batch.block_tables[i][: -(-ctx // batch.block_size)], dtype=torch.long, device=device)
            mask = _prefill_mask(ctx, end - start, spans, device)
            plain_causal = ctx == end - start and not spans
            prefill_rows.append(_PrefillRow(start, end, ctx, blocks, mask, plain_causal))
        decode_groups = [_decode_group(batch, group, device) for group in _group_by_length(batch, decodes)]
        batch.plan = _Plan(num_heads > num_kv_heads, prefill_rows, decode_groups, {})

    def write_kv(self, k_cache, v_cache, k, v, batch: AttentionBatch) -> None:
        num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
        k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, batch.slot_mapping, k)
        v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, batch.slot_mapping, v)

    def attend(self, q, k_cache, v_cache, batch: AttentionBatch, scale: float, *, sliding_window: int | None = None) -> torch.Tensor:
        plan: _Plan = batch.plan
        out = torch.empty_like(q)
        prefill_masks = [row.mask for row in plan.prefill_rows]
        decode_masks = [group.mask for group in plan.decode_groups]
        if sliding_window is not None:
            prefill_masks, decode_masks = _windowed(plan, sliding_window)
        for row, mask in zip(plan.prefill_rows, prefill_masks):
            causal = row.plain_causal and sliding_window is None
            rows = slice(row.start, row.end)
            out[rows] = _attend_prefill(q[rows], k_cache, v_cache, row, None if causal else mask, scale, plan.gqa)
        for group, mask in zip(plan.decode_groups, decode_masks):
            out[group.rows] = _attend_decode(q.index_select(0, group.rows), k_cache, v_cache, group, mask, scale, plan.gqa)
        return out


def _windowed(plan: _Plan, window: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The step's masks with keys k <= q - window hidden, made once per step and window."""
    if window not in plan.window_masks:
        prefill = []
        for row in plan.prefill_rows:
            num_new, ctx = row.end - row.start, row.context_len
            q_pos = torch.arange(ctx - num_new, ctx, device=row.mask.device)[:, None]
            prefill.append(row.mask & (torch.arange(ctx, device=row.mask.device)[None, :] > q_pos - window))
        decode = []
        for group in plan.decode_groups:
            key_pos = torch.arange(group.mask.shape[-1], device=group.mask.device)
            last = group.mask.sum(-1, keepdim=True) - 1  # each row's query position: its context's last token
            decode.append(group.mask & (key_pos > last - window))
        plan.window_masks[window] = (prefill, decode)
    return plan.window_masks[window]


def _attend_prefill(q, k_cache, v_cache, row: _PrefillRow, mask: torch.Tensor | None, scale: float, gqa: bool) -> torch.Tensor:
    """mask None: plainly causal. The inputs are 4-D ([1, heads, tokens, head_dim]) because on CPU
    only 4-D inputs reach the flash kernel; 3-D ones fall back to the math path, which
    materializes every score (docs/benchmarks.md, "Prefill attention on the flash kernel").
    is_causal lets the flash kernel skip the blocks above the diagonal."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    ctx = row.context_len
    keys = k_cache.index_select(0, row.blocks).reshape(-1, num_kv_heads, head_dim)[:ctx]
    values = v_cache.index_select(0, row.blocks).reshape(-1, num_kv_heads, head_dim)[:ctx]
    attn = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        keys.transpose(0, 1)[None],
        values.transpose(0, 1)[None],
        attn_mask=None if mask is None else mask[None, None],
        is_causal=mask is None,
        scale=scale,
        enable_gqa=gqa,
    )
    return attn[0].transpose(0, 1)


def _attend_decode(q, k_cache, v_cache, group: _DecodeGroup, mask: torch.Tensor, scale: float, gqa: bool) -> torch.Tensor:
    num_rows, num_blocks = group.blocks.shape
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    shape = (num_rows, num_blocks * k_cache.shape[1], num_kv_heads, head_dim)
    keys = k_cache[group.blocks].reshape(shape).transpose(1, 2)  # [B, kv_heads, L, D]
    values = v_cache[group.blocks].reshape(shape).transpose(1, 2)
    attn = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=mask, scale=scale, enable_gqa=gqa)  # [B, heads, 1, D]
    return attn.squeeze(2)


def _prefill_mask(ctx: int, num_new: int, spans: list[tuple[int, int]], device: torch.device) -> torch.Tensor:
    """[num_new, ctx]: causal (new token j sits at ctx - num_new + j), and each span's tokens see
    the whole span."""
    positions = torch.arange(ctx - num_new, ctx, device=device)
    keys = torch.arange(ctx, device=device)
    mask = keys[None, :] <= positions[:, None]
    for lo, hi in spans:
        if lo < ctx and hi > ctx - num_new:
            rows = slice(max(lo, ctx - num_new) - (ctx - num_new), min(hi, ctx) - (ctx - num_new))
            mask[rows, lo : min(hi, ctx)] = True
    return mask


def _group_by_length(batch: AttentionBatch, decodes: list[int]) -> list[list[int]]:
    """Decode requests by ascending context, cut where padding to the group's longest context
    would more than double its keys or pass MAX_GROUP_KEYS."""
    groups: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i in sorted(decodes, key=lambda i: batch.context_lens[i]):
        ctx = batch.context_lens[i]
        padded = (len(current) + 1) * ctx  # sorted: this one is the group's longest
        if current and (padded > 2 * (total + ctx) or padded > MAX_GROUP_KEYS):
            groups.append(current)
            current, total = [], 0
        current.append(i)
        total += ctx
    if current:
        groups.append(current)
    return groups


def _decode_group(batch: AttentionBatch, requests: list[int], device: torch.device) -> _DecodeGroup:
    size = batch.block_size
    num_blocks = -(-max(batch.context_lens[i] for i in requests) // size)
    tables = []
    for i in requests:
        own = batch.block_tables[i][: -(-batch.context_lens[i] // size)]
        tables.append(own + [own[0]] * (num_blocks - len(own)))  # padding: any valid block, masked out
    contexts = torch.tensor([batch.context_lens[i] for i in requests], device=device)
    mask = torch.arange(num_blocks * size, device=device)[None, :] < contexts[:, None]
    return _DecodeGroup(
        rows=torch.tensor([batch.query_start_loc[i] for i in requests], dtype=torch.long, device=device),
        blocks=torch.tensor(tables, dtype=torch.long, device=device),
        mask=mask[:, None, None, :],
    )
