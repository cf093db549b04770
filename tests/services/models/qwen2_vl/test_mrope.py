from __future__ import annotations

import pytest
import torch

from services.models.qwen2_vl.mrope import mrope_positions
from shared.types import GroupPlacement, PlaceholderRange


def test_text_only_positions_are_sequential_on_all_axes():
    positions, delta = mrope_positions(5, [], [], merge_size=2)
    assert torch.equal(positions, torch.arange(5).expand(3, 5))
    assert delta == 0


def test_image_positions_follow_the_grid_and_text_resumes_after_max_side():
    # 2 text tokens, an image of llm grid 1x2x3 (6 tokens), then 2 text tokens.
    positions, delta = mrope_positions(10, [PlaceholderRange(2, 6)], [(1, 4, 6)], merge_size=2)
    assert positions[:, :2].tolist() == [[0, 1]] * 3
    assert positions[0, 2:8].tolist() == [2] * 6
    assert positions[1, 2:8].tolist() == [2, 2, 2, 3, 3, 3]
    assert positions[2, 2:8].tolist() == [2, 3, 4, 2, 3, 4]
    assert positions[:, 8:].tolist() == [[5, 6]] * 3  # 2 + max(2, 3)
    assert delta == 7 - 10


def test_a_videos_groups_share_its_start_and_step_the_temporal_axis_only():
    """A clip of 3 groups of llm grid 1x1x2 (2 tokens each) at offset 1, Qwen2.5-VL-spaced by 4:
    every group starts where the clip starts; text after it resumes at start + max(h, w)."""
    groups = [GroupPlacement(index=k, time_position=4 * k) for k in range(3)]
    ranges = [PlaceholderRange(1 + 2 * k, 2) for k in range(3)]
    positions, delta = mrope_positions(9, ranges, [(1, 2, 4)] * 3, merge_size=2, groups=groups)
    assert positions[0, 1:7].tolist() == [1, 1, 5, 5, 9, 9]
    assert positions[1, 1:7].tolist() == [1] * 6
    assert positions[2, 1:7].tolist() == [1, 2] * 3
    assert positions[:, 7:].tolist() == [[3, 4]] * 3
    assert delta == 10 - 9  # the last group's time position is the maximum


def test_a_group_that_does_not_follow_its_clip_is_refused():
    groups = [GroupPlacement(0, 0), GroupPlacement(1, 1)]
    with pytest.raises(ValueError, match="adjacent"):
        mrope_positions(8, [PlaceholderRange(0, 2), PlaceholderRange(3, 2)], [(1, 2, 4)] * 2, merge_size=2, groups=groups)


def test_adjacent_clips_each_open_at_their_own_start():
    groups = [GroupPlacement(0, 0), GroupPlacement(0, 0)]
    positions, _ = mrope_positions(4, [PlaceholderRange(0, 2), PlaceholderRange(2, 2)], [(1, 2, 4)] * 2, merge_size=2, groups=groups)
    assert positions[0].tolist() == [0, 0, 2, 2]
