"""Gemma3 takes no video: a request with one is refused with a 400 that says so, before anything
is rendered or decoded."""

from __future__ import annotations

import pytest

from services.preprocess.errors import InvalidVideoDataError
from services.preprocess.preprocessor import Preprocessor
from tests.factories import Video, chat_case, make_clip


def test_a_video_for_gemma3_is_a_400_that_says_the_model_takes_none(gemma3_model):
    preprocessor = Preprocessor(gemma3_model)
    case = chat_case(Video(make_clip(4)), "What happens?")
    with pytest.raises(InvalidVideoDataError, match="takes no video"):
        preprocessor.preprocess(case.prompt)
    assert preprocessor.preprocess(chat_case("Still fine?").prompt).num_prompt_tokens > 0
