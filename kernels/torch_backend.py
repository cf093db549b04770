"""PyTorch reference attention over the paged KV cache (CPU and GPU).

Per request: gather its context K/V through the block table and run
scaled-dot-product attention (grouped-query heads shared natively) with a causal mask aligned to the end of the context (new token j
of n sits at absolute position context_len - n + j).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.attention import AttentionBatch


class TorchReferenceBackend:
    name = "torch"

    def prepare(self, batch: AttentionBatch, *, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        self._num_groups = num_heads // num_kv_heads

    def write_kv(self, k_cache, v_cache, k, v, batch: AttentionBatch) -> None:
        num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
        k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, batch.slot_mapping, k)
        v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, batch.slot_mapping, v)

    def attend(self, q, k_cache, v_cache, batch: AttentionBatch, scale: float) -> torch.Tensor:
        out = torch.empty_like(q)
        num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
        for i in range(batch.num_reqs):
            start, end = batch.query_start_loc[i], batch.query_start_loc[i + 1]
            num_new, ctx = end - start, batch.context_lens[i]
            num_blocks = -(-ctx // batch.block_size)
            blocks = torch.tensor(batch.block_tables[i][:num_blocks], dtype=torch.long, device=q.device)
            keys = k_cache.index_select(0, blocks).reshape(-1, num_kv_heads, head_dim)[:ctx]
            values = v_cache.index_select(0, blocks).reshape(-1, num_kv_heads, head_dim)[:ctx]
            query = q[start:end].transpose(0, 1)  # [H, n, D]
            mask = None
            if num_new > 1:
                positions = torch.arange(ctx - num_new, ctx, device=q.device)
                mask = torch.arange(ctx, device=q.device)[None, :] <= positions[:, None]
            attn = F.scaled_dot_product_attention(
                query,
                keys.transpose(0, 1),
                values.transpose(0, 1),
                attn_mask=mask,
                scale=scale,
                enable_gqa=self._num_groups > 1,
            )
            out[start:end] = attn.transpose(0, 1)
        return out
