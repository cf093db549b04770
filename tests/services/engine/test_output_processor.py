"""Stop strings and the streaming holdback (pure logic, with a one-character-per-token tokenizer)."""

from __future__ import annotations

import torch

from services.engine.output_processor import OutputProcessor
from services.engine.request import Request, RequestStatus
from services.engine.sampling_params import SamplingParams
from shared.holdback import num_held_back

EOS = 0


class CharTokenizer:
    """Token id i is chr(i); 0 is EOS."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i != EOS)


def request_with(**sampling) -> Request:
    return Request("r1", [1, 2, 3], SamplingParams(**sampling), torch.zeros(3, 3, dtype=torch.long), 0)


def feed(text: str, **sampling) -> tuple[list[str], RequestStatus | None, Request]:
    """The released text after each character of ``text``, and how the request finished."""
    processor, request = OutputProcessor(CharTokenizer(), (EOS,)), request_with(**sampling)
    released = []
    for ch in text:
        status = processor.append_token(request, ord(ch))
        released.append(request.output_text)
        if status is not None:
            return released, status, request
    return released, None, request


def test_num_held_back_is_the_longest_tail_that_could_become_a_stop():
    assert num_held_back("hello EN", ("END",)) == 2
    assert num_held_back("hello E", ("END", "Eve")) == 1
    assert num_held_back("hello", ("END",)) == 0
    assert num_held_back("abab", ("ababc",)) == 4
    assert num_held_back("", ("END",)) == 0


def test_a_stream_never_releases_text_the_stop_cut_removes():
    released, status, request = feed("say ENough END more", stop=("END",), max_tokens=100)
    assert status is RequestStatus.FINISHED_STOPPED and request.output_text == "say ENough "
    for earlier, later in zip(released, released[1:]):
        assert later.startswith(earlier), (earlier, later)  # released text only grows
    assert released[4] == released[5] == "say "  # "E", then "EN" held back ...
    assert released[6] == "say ENo"  # ... until "o" showed they were not a stop


def test_a_tail_is_released_when_the_request_ends_for_another_reason():
    released, status, request = feed("abcEN", stop=("END",), max_tokens=5)
    assert status is RequestStatus.FINISHED_LENGTH and request.output_text == "abcEN"
    assert released[-2] == "abc"


def test_a_character_split_across_tokens_is_held_back_until_complete():
    processor, request = OutputProcessor(CharTokenizer(), (EOS,)), request_with(max_tokens=10)
    processor.append_token(request, ord("a"))
    processor.append_token(request, 0xFFFD)  # what decoding half of a multi-byte character gives
    assert processor.snapshot(request, [0xFFFD]).text == "a"
