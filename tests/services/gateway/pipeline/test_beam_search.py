"""Beam search's policy (beam_search.py) against hand-worked cases, and its search over a
scripted model: the steps it runs and the beams it keeps."""

from __future__ import annotations

import asyncio
import math

import pytest

from protos.gen import pb
from services.gateway.errors import GatewayError
from services.gateway.frontend.sampling import BeamSearch
from services.gateway.pipeline.beam_search import Beam, advance, beam_score, best_beams, search_prompt
from services.gateway.pipeline.token_events import TokenEvent, TokenLogprob

EOS = frozenset({0})


def test_advance_keeps_the_width_best_by_summed_logprob_and_completes_on_a_stop_token():
    beams = [Beam((5,), -1.0), Beam((6,), -2.0)]
    candidates = [[(7, -0.5), (0, -0.1), (8, -3.0)], [(9, -0.2), (10, -0.4)]]
    going_on, completed = advance(beams, candidates, BeamSearch(width=2, max_tokens=4), EOS)
    assert going_on == [Beam((5, 7), -1.5), Beam((6, 9), -2.2)]
    assert completed == [Beam((5,), -1.1, "stop")]  # the stop token is left out of its tokens
    going_on, completed = advance(beams, candidates, BeamSearch(width=2, max_tokens=4, ignore_eos=True), EOS)
    assert going_on == [Beam((5, 0), -1.1), Beam((5, 7), -1.5)] and completed == []


def test_the_ranking_divides_by_the_length_counting_the_prompt_to_the_length_penalty():
    short, long = Beam((1,), -2.0, "stop"), Beam((1, 2, 3), -2.4)
    assert beam_score(long, 7, 1.0) == pytest.approx(-0.24) and beam_score(short, 7, 0.0) == -2.0
    assert best_beams([long], [short], 7, BeamSearch(width=1, max_tokens=3)) == [long]  # -0.24 beats -0.25
    assert best_beams([long], [short], 7, BeamSearch(width=1, max_tokens=3, length_penalty=0.0)) == [short]


class ScriptedModel:
    """Next-token logprobs as a function of the tokens so far: favours (last + 1) % 4, then
    (last + 2) % 4; token 0 is the stop token."""

    def __init__(self) -> None:
        self.prompts: list[list[int]] = []

    async def __call__(self, prompt: pb.PromptInput, sampling) -> TokenEvent:
        ids = list(prompt.token_ids.ids) if prompt.WhichOneof("prompt") == "token_ids" else [3, 1]  # the text prompt "tokenized"
        self.prompts.append(ids)
        last = ids[-1]
        top = [((last + 1) % 4, math.log(0.6)), ((last + 2) % 4, math.log(0.3)), ((last + 3) % 4, math.log(0.1))]
        top = top[: sampling.logprobs]
        first = top[0][0]
        return TokenEvent(
            [first], "", True, "length", 2, 0, (TokenLogprob(first, "", top[0][1], tuple((t, "", v) for t, v in top)),), tuple(ids[:2])
        )


def test_a_search_runs_one_step_per_live_beam_on_the_prompt_ids_and_its_tokens():
    model = ScriptedModel()
    prompt_ids, beams = asyncio.run(search_prompt(model, pb.PromptInput(text="hi"), BeamSearch(width=2, max_tokens=3), EOS, 64))
    assert prompt_ids == (3, 1)
    assert len(model.prompts) == 1 + 2 + 2  # the prompt, then two beams a step
    assert model.prompts[1:3] == [[3, 1, 2], [3, 1, 3]]
    # Worked by hand: after three steps the best by logprob / (2 + length) are (2, 3), which
    # stopped at step 3 (0.6 * 0.6 * 0.6, over 4), and the live (2, 3, 1) (0.6 * 0.6 * 0.3, over 5).
    assert [(b.token_ids, b.finish_reason) for b in beams] == [((2, 3), "stop"), ((2, 3, 1), None)]
    assert [b.cum_logprob for b in beams] == pytest.approx([math.log(0.6**3), math.log(0.6 * 0.6 * 0.3)])


def test_a_prompt_with_media_is_refused():
    prompt = pb.PromptInput(text="x", images=[pb.ImageInput(url="https://example.com/a.png")])
    with pytest.raises(GatewayError, match="text prompts"):
        asyncio.run(search_prompt(ScriptedModel(), prompt, BeamSearch(width=2, max_tokens=2), EOS, 64))
