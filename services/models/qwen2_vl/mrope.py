"""M-RoPE position ids for Qwen2-VL (three axes: temporal, height, width).

Layout, walking the prompt left to right with a running start position p:
  text token        -> (p, p, p), then p += 1
  image of llm grid (t, h, w) = (grid_t, grid_h / merge, grid_w / merge), placed at p:
                       token (ti, hi, wi) in row-major order -> (p + ti, p + hi, p + wi)
                       then p += max(h, w)   (t is 1 for images)
mrope_delta = max position + 1 - prompt length; decode step k (0-based) uses position
prompt_length + k + mrope_delta on all three axes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shared.types import PlaceholderRange


def mrope_positions(
    num_tokens: int,
    ranges: Sequence[PlaceholderRange],
    grids_thw: Sequence[tuple[int, int, int]],
    merge_size: int,
) -> tuple[torch.Tensor, int]:
    """(positions of shape (3, num_tokens) int64, mrope_delta)."""
    positions = torch.empty(3, num_tokens, dtype=torch.long)
    start = 0
    cursor = 0
    for item_range, (grid_t, grid_h, grid_w) in sorted(zip(ranges, grids_thw), key=lambda x: x[0].offset):
        text_len = item_range.offset - cursor
        positions[:, cursor : item_range.offset] = torch.arange(start, start + text_len)
        start += text_len
        llm_t, llm_h, llm_w = grid_t, grid_h // merge_size, grid_w // merge_size
        if llm_t * llm_h * llm_w != item_range.length:
            raise ValueError(f"grid {grid_t}x{grid_h}x{grid_w} does not match {item_range.length} placeholder tokens")
        t_idx = torch.arange(llm_t).view(-1, 1, 1).expand(llm_t, llm_h, llm_w).reshape(-1)
        h_idx = torch.arange(llm_h).view(1, -1, 1).expand(llm_t, llm_h, llm_w).reshape(-1)
        w_idx = torch.arange(llm_w).view(1, 1, -1).expand(llm_t, llm_h, llm_w).reshape(-1)
        positions[:, item_range.offset : item_range.end] = torch.stack([t_idx, h_idx, w_idx]) + start
        start += max(llm_h, llm_w)
        cursor = item_range.end
    positions[:, cursor:] = torch.arange(start, start + num_tokens - cursor)
    delta = int(positions.max().item()) + 1 - num_tokens if num_tokens else 0
    return positions, delta
