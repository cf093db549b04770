from __future__ import annotations

import torch

from services.models.qwen2_vl.mrope import mrope_positions
from shared.types import PlaceholderRange


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
