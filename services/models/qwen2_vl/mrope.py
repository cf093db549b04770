"""M-RoPE position ids for Qwen2-VL (three axes: temporal, height, width), as transformers'
get_rope_index lays them out.

Layout, walking the prompt left to right with a running start position p:
  text token        -> (p, p, p), then p += 1
  image of llm grid (t, h, w) = (grid_t, grid_h / merge, grid_w / merge), placed at p:
                       token (ti, hi, wi) in row-major order -> (p + ti, p + hi, p + wi)
                       then p += max(h, w)   (t is 1 for images)
  video: its temporal groups are items of grid (1, h, w) placed at the video's start p; group k
                       adds its time position (k, or Qwen2.5-VL's seconds-scaled k) on the
                       temporal axis only; after the video p += max(h, w), whatever its length
mrope_delta = max position + 1 - prompt length; decode step k (0-based) uses position
prompt_length + k + mrope_delta on all three axes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from shared.types import GroupPlacement, PlaceholderRange


def mrope_positions(
    num_tokens: int,
    ranges: Sequence[PlaceholderRange],
    grids_thw: Sequence[tuple[int, int, int]],
    merge_size: int,
    groups: Sequence[GroupPlacement | None] = (),
) -> tuple[torch.Tensor, int]:
    """(positions of shape (3, num_tokens) int64, mrope_delta). ``groups[i]``: item i's place in
    its video, None (or no entry) for an image."""
    positions = torch.empty(3, num_tokens, dtype=torch.long)
    placements = list(groups) + [None] * (len(ranges) - len(groups))
    start = 0
    cursor = 0
    video_start = 0
    for item_range, (grid_t, grid_h, grid_w), group in sorted(zip(ranges, grids_thw, placements), key=lambda x: x[0].offset):
        if group is not None and group.index > 0:
            if item_range.offset != cursor:
                raise ValueError("a video's temporal groups must be adjacent in the prompt")
            start = video_start
        text_len = item_range.offset - cursor
        positions[:, cursor : item_range.offset] = torch.arange(start, start + text_len)
        start += text_len
        video_start = start
        llm_t, llm_h, llm_w = grid_t, grid_h // merge_size, grid_w // merge_size
        if llm_t * llm_h * llm_w != item_range.length:
            raise ValueError(f"grid {grid_t}x{grid_h}x{grid_w} does not match {item_range.length} placeholder tokens")
        t_idx = torch.arange(llm_t).view(-1, 1, 1).expand(llm_t, llm_h, llm_w).reshape(-1)
        h_idx = torch.arange(llm_h).view(1, -1, 1).expand(llm_t, llm_h, llm_w).reshape(-1)
        w_idx = torch.arange(llm_w).view(1, 1, -1).expand(llm_t, llm_h, llm_w).reshape(-1)
        block = torch.stack([t_idx, h_idx, w_idx]) + start
        if group is not None:
            block[0] += group.time_position
        positions[:, item_range.offset : item_range.end] = block
        start += max(llm_h, llm_w)
        cursor = item_range.end
    positions[:, cursor:] = torch.arange(start, start + num_tokens - cursor)
    delta = int(positions.max().item()) + 1 - num_tokens if num_tokens else 0
    return positions, delta
