"""Placeholder expansion at the token level (seeds 003 and 004), for families whose image and
video markers are single tokens that become runs of placeholder tokens (Qwen2-VL, Qwen3-VL).

Each image is marked in the prompt by exactly one ``<|image_pad|>`` token, each video by one
``<|video_pad|>``. The i-th marker of a kind, in order of appearance, is replaced by the i-th
item of that kind: one or more spans, each a run of ``num_tokens`` copies of the marker with the
text tokens the layout puts before and after it (Qwen3-VL writes ``<t seconds><|vision_start|>``
before each temporal group of a video, and ``<|vision_end|>`` after). An image's run is
grid_t * grid_h * grid_w / merge_size**2 tokens. The same function serves text prompts (after
tokenization) and pre-tokenized prompts, so both paths agree by construction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.models.family import PlaceholderCountError
from shared.types import PlaceholderRange


@dataclass(frozen=True, slots=True)
class Span:
    """One run of placeholder tokens and the text tokens around it."""

    num_tokens: int
    before: tuple[int, ...] = ()
    after: tuple[int, ...] = ()


def expand_markers(
    token_ids: Sequence[int], marker_to_items: Mapping[int, tuple[str, Sequence[Sequence[Span]]]]
) -> tuple[list[int], dict[int, list[PlaceholderRange]]]:
    """Expanded token ids, and per marker id the ranges of its items' spans in prompt order.
    ``marker_to_items``: marker id -> (its kind's name for errors, the items' spans in order)."""
    for marker, (kind, items) in marker_to_items.items():
        count = sum(1 for t in token_ids if t == marker)
        if count != len(items):
            raise PlaceholderCountError(f"prompt has {count} {kind} placeholder(s) but {len(items)} {kind}(s) were given")
    pending = {marker: iter(items) for marker, (_, items) in marker_to_items.items()}
    ranges: dict[int, list[PlaceholderRange]] = {marker: [] for marker in marker_to_items}
    expanded: list[int] = []
    for token in token_ids:
        if token not in pending:
            expanded.append(token)
            continue
        for span in next(pending[token]):
            if span.num_tokens <= 0:
                raise ValueError(f"a placeholder span must hold at least one token, got {span.num_tokens}")
            expanded.extend(span.before)
            ranges[token].append(PlaceholderRange(offset=len(expanded), length=span.num_tokens))
            expanded.extend([token] * span.num_tokens)
            expanded.extend(span.after)
    return expanded, ranges
