"""Greedy float32 output equals transformers' generate token for token, on every path."""

from __future__ import annotations

import pytest
import torch

from services.engine.config import EngineConfig
from services.engine.llm import LLM
from services.engine.sampling_params import SamplingParams
from tests.factories import chat_case, encode_image, make_image
from tests.oracle import assert_tokens_match
from tests.services.engine.conftest import GREEDY_16, oracle_tokens


def _png(w, h, seed):
    return encode_image(make_image(w, h, seed=seed))


CASES = {
    "text_only": lambda: chat_case("Describe the weather in one sentence."),
    "one_image": lambda: chat_case(_png(112, 112, 1), "What is in this image?"),
    "three_images": lambda: chat_case(_png(56, 56, 2), "one", _png(84, 56, 3), "two", _png(56, 112, 4), "three"),
    "image_mid_prompt": lambda: chat_case("Look closely at", _png(98, 70, 5), "and tell me what you see."),
    "448x448": lambda: chat_case(_png(448, 448, 6), "Describe."),
    "1024x768": lambda: chat_case(_png(1024, 768, 7), "Describe."),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_single_request_matches_oracle(name, make_llm, oracle):
    case = CASES[name]()
    [result] = make_llm().generate([case.prompt], GREEDY_16)
    assert_tokens_match(result.token_ids, oracle_tokens(oracle, case), context=name)
    assert result.usage.prompt_tokens == len(oracle.process(oracle.chat_text(case.oracle_messages), case.images).token_ids)


def test_the_vision_tower_sums_as_transformers_tower_does(make_llm, oracle):
    """Exactness starts at the embeddings: by default (prepack_vision off) the engine's tower
    output is bitwise transformers' own, for every image of a request."""
    case = CASES["three_images"]()
    llm = make_llm()
    images = [item.image for item in llm.preprocessor.preprocess(case.prompt).mm_items]
    ours = llm.engine.runner.vision.encode([i.pixel_values for i in images], [i.grid_thw for i in images])
    theirs = oracle.image_features(oracle.process(oracle.chat_text(case.oracle_messages), case.images))
    assert torch.equal(torch.cat(ours), theirs)


def test_image_requests_on_the_small_model_match_oracle():
    """The built-in ``small`` amplifies any change in its tower's summation order (a packed tower
    diverged on most of these requests): every one must match."""
    from tests.oracle import ReferenceOracle

    llm = LLM("small", EngineConfig())
    small_oracle = ReferenceOracle(llm.model.path)
    questions = ("What is in this image?", "Describe the colours.", "Count the shapes.", "What style is it?")
    for seed in range(800, 808):
        case = chat_case(_png(448, 448, seed), questions[seed % 4])
        [result] = llm.generate([case.prompt], SamplingParams(max_tokens=24, ignore_eos=True))
        assert_tokens_match(result.token_ids, oracle_tokens(small_oracle, case, 24), context=f"small, image seed {seed}")


def _batch_of_8():
    return [
        chat_case("Hello there, who are you?"),
        chat_case(_png(112, 112, 11), "What is this?"),
        chat_case("Tell me a story about", _png(70, 98, 12), "in detail"),
        chat_case(_png(56, 56, 13), "a", _png(56, 84, 14), "b"),
        chat_case("Count from one to ten."),
        chat_case(_png(140, 112, 15), "Caption it."),
        chat_case(_png(112, 112, 11), "Different question, same image."),
        chat_case("Short."),
    ]


@pytest.mark.parametrize(
    "engine_config",
    [
        {},
        {"max_num_batched_tokens": 64},
        {"max_num_batched_tokens": 64, "disable_chunked_mm_input": True},
        {"max_num_batched_tokens": 64, "disable_chunked_mm_input": False, "block_size": 4},
    ],
    ids=["batched", "chunked_64", "chunked_64_no_split_mm", "chunked_64_block4"],
)
def test_batch_of_8_in_flight_matches_oracle(engine_config, make_llm, oracle):
    cases = _batch_of_8()
    llm = make_llm(**engine_config)
    results = llm.generate([c.prompt for c in cases], GREEDY_16)
    for i, (case, result) in enumerate(zip(cases, results)):
        assert_tokens_match(result.token_ids, oracle_tokens(oracle, case), context=f"request {i} {engine_config}")
    if engine_config:
        assert llm.engine.num_steps > 16  # prefill really was chunked across steps


def test_chunked_prefill_with_image_spanning_chunks(make_llm, oracle):
    case = chat_case("x " * 30, _png(224, 224, 21), "what is it?")  # 64 image tokens straddle chunk borders
    for disable in (False, True):
        [result] = make_llm(max_num_batched_tokens=64, disable_chunked_mm_input=disable).generate([case.prompt], GREEDY_16)
        assert_tokens_match(result.token_ids, oracle_tokens(oracle, case), context=f"disable_chunked_mm_input={disable}")


@pytest.mark.parametrize("screen_greedy", [True, False], ids=["screened", "float32-head"])
def test_greedy_tokens_match_oracle_with_and_without_the_screened_head(screen_greedy, make_llm, oracle):
    cases = _batch_of_8()
    llm = make_llm(screen_greedy=screen_greedy)
    head = llm.engine.runner.decoder.screened_head
    if head is not None:
        head.max_rows = 8  # whatever the startup timing found worth it on this machine
    results = llm.generate([c.prompt for c in cases], GREEDY_16)
    for i, (case, result) in enumerate(zip(cases, results)):
        assert_tokens_match(result.token_ids, oracle_tokens(oracle, case), context=f"request {i}, screen_greedy={screen_greedy}")
    if screen_greedy and head is not None:
        assert head.num_rows_screened >= 8 * 16  # every token of every request went through it
    else:
        assert head is None
