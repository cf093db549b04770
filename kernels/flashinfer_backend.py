"""flashinfer paged attention, used only when CUDA is present. The import is guarded: on a
CPU-only machine this module imports cleanly and ``flashinfer_available()`` is False.

One ragged prefill wrapper serves the whole step (decode tokens are prefill chunks of length 1),
planned once per step in ``prepare`` and run by every layer.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from kernels.attention import AttentionBatch


@lru_cache(maxsize=1)
def flashinfer_available() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import flashinfer  # noqa: F401
    except Exception:
        return False
    return True


class FlashInferBackend:
    name = "flashinfer"

    def __init__(self, device: torch.device, workspace_bytes: int = 128 * 1024 * 1024) -> None:
        import flashinfer

        self._device = device
        workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=device)
        self._wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")

    def prepare(self, batch: AttentionBatch, *, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        kv_indptr, kv_indices, last_page_len = [0], [], []
        for ctx, table in zip(batch.context_lens, batch.block_tables):
            num_blocks = -(-ctx // batch.block_size)
            kv_indices.extend(table[:num_blocks])
            kv_indptr.append(kv_indptr[-1] + num_blocks)
            last_page_len.append(ctx - (num_blocks - 1) * batch.block_size)
        as_tensor = lambda xs: torch.tensor(xs, dtype=torch.int32, device=self._device)  # noqa: E731
        self._wrapper.plan(
            as_tensor(batch.query_start_loc),
            as_tensor(kv_indptr),
            as_tensor(kv_indices),
            as_tensor(last_page_len),
            num_heads,
            num_kv_heads,
            head_dim,
            batch.block_size,
            causal=True,
        )

    def write_kv(self, k_cache, v_cache, k, v, batch: AttentionBatch) -> None:
        num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
        k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, batch.slot_mapping, k)
        v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, batch.slot_mapping, v)

    def attend(self, q, k_cache, v_cache, batch: AttentionBatch, scale: float, *, sliding_window: int | None = None) -> torch.Tensor:
        if sliding_window is not None or batch.bidirectional_spans is not None:
            # Planned causal over whole contexts: neither a window nor image spans are in the plan.
            raise NotImplementedError("the flashinfer backend has no sliding-window or bidirectional-span attention; use the torch backend")
        return self._wrapper.run(q, (k_cache, v_cache))
