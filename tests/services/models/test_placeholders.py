from __future__ import annotations

import pytest

from services.models.family import PlaceholderCountError
from services.models.placeholders import Span, expand_markers
from shared.types import PlaceholderRange

P = 9


def expand_placeholders(token_ids, placeholder_id, counts):
    """Images only: one span per marker, as the Qwen families lay images out."""
    expanded, ranges = expand_markers(token_ids, {placeholder_id: ("image", [[Span(n)] for n in counts])})
    return expanded, ranges[placeholder_id]


def test_each_placeholder_expands_in_order():
    ids, ranges = expand_placeholders([1, P, 2, 3, P], P, [3, 2])
    assert ids == [1, P, P, P, 2, 3, P, P]
    assert ranges == [PlaceholderRange(1, 3), PlaceholderRange(6, 2)]


def test_adjacent_placeholders_and_edges():
    ids, ranges = expand_placeholders([P, P], P, [1, 2])
    assert ids == [P, P, P] and ranges == [PlaceholderRange(0, 1), PlaceholderRange(1, 2)]


def test_no_images_is_identity():
    assert expand_placeholders([1, 2], P, []) == ([1, 2], [])


@pytest.mark.parametrize("ids,counts", [([1, P], []), ([1, 2], [4]), ([P, P], [4])])
def test_count_mismatch_is_a_clear_error(ids, counts):
    with pytest.raises(PlaceholderCountError, match="image placeholder"):
        expand_placeholders(ids, P, counts)
