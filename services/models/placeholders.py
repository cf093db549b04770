"""Placeholder expansion at the token level (seeds 003 and 004), for families whose image marker
is one token that becomes the image's run of placeholder tokens (Qwen2-VL).

Each image is marked in the prompt by exactly one ``<|image_pad|>`` token. The i-th marker, in
order of appearance, is replaced by ``num_tokens[i]`` copies of the same token, where
num_tokens = grid_t * grid_h * grid_w / merge_size**2. The same function serves text prompts
(after tokenization) and pre-tokenized prompts, so both paths agree by construction.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.models.family import PlaceholderCountError
from shared.types import PlaceholderRange


def find_placeholders(token_ids: Sequence[int], placeholder_id: int) -> list[int]:
    return [i for i, t in enumerate(token_ids) if t == placeholder_id]


def expand_placeholders(
    token_ids: Sequence[int], placeholder_id: int, num_tokens_per_item: Sequence[int]
) -> tuple[list[int], list[PlaceholderRange]]:
    """Expanded token ids and one PlaceholderRange per item, in prompt order."""
    positions = find_placeholders(token_ids, placeholder_id)
    if len(positions) != len(num_tokens_per_item):
        raise PlaceholderCountError(f"prompt has {len(positions)} image placeholder(s) but {len(num_tokens_per_item)} image(s) were given")
    expanded: list[int] = []
    ranges: list[PlaceholderRange] = []
    cursor = 0
    for position, count in zip(positions, num_tokens_per_item):
        if count <= 0:
            raise ValueError(f"an image must expand to at least one token, got {count}")
        expanded.extend(token_ids[cursor:position])
        ranges.append(PlaceholderRange(offset=len(expanded), length=count))
        expanded.extend([placeholder_id] * count)
        cursor = position + 1
    expanded.extend(token_ids[cursor:])
    return expanded, ranges
