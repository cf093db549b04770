"""truncate_prompt_tokens on the tokenized prompt: which side is kept, and media refused."""

from __future__ import annotations

import pytest

from services.preprocess.errors import InvalidRequestError
from services.preprocess.truncation import Truncation, truncated

IDS = list(range(10))


def test_left_keeps_the_last_tokens_right_the_first_and_unset_follows_the_tokenizer():
    assert truncated(IDS, Truncation(4, "left"), "right", has_media=False) == [6, 7, 8, 9]
    assert truncated(IDS, Truncation(4, "right"), "left", has_media=False) == [0, 1, 2, 3]
    assert truncated(IDS, Truncation(4), "left", has_media=False) == [6, 7, 8, 9]
    assert truncated(IDS, Truncation(4), "right", has_media=False) == [0, 1, 2, 3]


def test_a_prompt_that_fits_is_untouched_even_with_media():
    assert truncated(IDS, Truncation(10), "left", has_media=True) is IDS
    assert truncated(IDS, None, "left", has_media=True) is IDS


def test_cutting_a_prompt_with_media_or_to_nothing_is_refused():
    with pytest.raises(InvalidRequestError, match="images or videos"):
        truncated(IDS, Truncation(4), "left", has_media=True)
    with pytest.raises(InvalidRequestError, match="at least 1"):
        Truncation(0)
