"""Qwen3-VL (tiny built-in): greedy float32 output equals transformers' generate token for token,
on every in-engine path: image placement, several images, multi-turn, an image split across
prefill chunks (each chunk must add its own rows' DeepStack levels), a batch in flight, and prefix
and encoder-cache hits (also a prefix hit that ends inside an image)."""

from __future__ import annotations

import pytest

from services.engine.config import EngineConfig
from services.engine.llm import LLM
from services.engine.sampling_params import SamplingParams
from tests.factories import chat_case, conversation, encode_image, make_image
from tests.oracle import ReferenceOracle, assert_tokens_match

GREEDY_12 = SamplingParams(max_tokens=12, ignore_eos=True)


def _png(w, h, seed):
    return encode_image(make_image(w, h, seed=seed))


def _oracle_tokens(oracle: ReferenceOracle, case, max_new_tokens: int = 12) -> object:
    return oracle.generate(oracle.process(oracle.chat_text(case.oracle_messages), case.images), max_new_tokens)


# Qwen3-VL resizes to at least 256x256 pixels: every image here is 64 tokens or more.
CASES = {
    "text_only": lambda: chat_case("Describe the weather in one sentence."),
    "one_image_at_start": lambda: chat_case(_png(112, 112, 1), "What is in this image?"),
    "two_images": lambda: chat_case(_png(56, 56, 2), "one", _png(300, 200, 3), "two"),
    "image_in_middle": lambda: chat_case("Look closely at", _png(98, 70, 5), "and tell me what you see."),
    "image_at_end": lambda: chat_case("What is this?", _png(98, 70, 6)),
    "wide_image": lambda: chat_case(_png(512, 288, 7), "Describe the wide picture."),  # a 32x18 patch grid
}


@pytest.fixture(scope="module")
def shared_llm(qwen3vl_model) -> LLM:
    # One engine for the single-request cases: their images differ, so no case hits another's caches.
    return LLM(str(qwen3vl_model.path), EngineConfig())


@pytest.mark.parametrize("name", sorted(CASES))
def test_single_request_matches_oracle(name, shared_llm, qwen3vl_oracle):
    case = CASES[name]()
    [result] = shared_llm.generate([case.prompt], GREEDY_12)
    inputs = qwen3vl_oracle.process(qwen3vl_oracle.chat_text(case.oracle_messages), case.images)
    assert shared_llm.preprocessor.preprocess(case.prompt).prompt_token_ids == inputs.token_ids
    assert_tokens_match(result.token_ids, qwen3vl_oracle.generate(inputs, 12), context=name)
    assert result.usage.prompt_tokens == len(inputs.token_ids)


def test_multi_turn_with_a_repeated_image_matches_oracle(make_qwen3vl_llm, qwen3vl_oracle):
    image = _png(80, 80, 8)
    first = chat_case(image, "What is this?")
    second = conversation(first, "A pattern.", chat_case(image, "And again?"))
    llm = make_qwen3vl_llm()
    for case in (first, second):  # the second turn hits the first's prefix and its image
        [result] = llm.generate([case.prompt], GREEDY_12)
        assert_tokens_match(result.token_ids, _oracle_tokens(qwen3vl_oracle, case), context="multi-turn")
    assert result.usage.cached_tokens > 0
    assert llm.engine.runner.vision.num_items_encoded == 1  # three sights of one image, one encoding


def test_an_image_split_across_prefill_chunks_matches_oracle(make_qwen3vl_llm, qwen3vl_oracle):
    """24-token steps cut the 64-token image (and the text before it) at unaligned offsets: each
    chunk merges its rows of the main embedding and adds its rows of every DeepStack level."""
    case = chat_case("x " * 7, _png(224, 224, 21), "what is it?")
    llm = make_qwen3vl_llm(max_num_batched_tokens=24)
    assert not llm.engine.config.disable_chunked_mm_input  # images may be split for this family
    [item] = llm.preprocessor.preprocess(case.prompt).mm_items
    assert item.placeholder.offset % 24 != 0 and item.placeholder.length > 2 * 24
    [result] = llm.generate([case.prompt], GREEDY_12)
    assert_tokens_match(result.token_ids, _oracle_tokens(qwen3vl_oracle, case), context="image split across chunks")
    assert llm.engine.num_steps >= result.usage.prompt_tokens // 24 + 11  # prefill really ran in chunks


def test_batch_in_flight_with_chunked_prefill_matches_oracle(make_qwen3vl_llm, qwen3vl_oracle):
    """Several requests share each step; image rows of different requests sit in one batch."""
    cases = [CASES[name]() for name in ("one_image_at_start", "text_only", "two_images", "image_in_middle", "image_at_end")]
    llm = make_qwen3vl_llm(max_num_batched_tokens=64)
    results = llm.generate([c.prompt for c in cases], GREEDY_12)
    for case, result in zip(cases, results):
        assert_tokens_match(result.token_ids, _oracle_tokens(qwen3vl_oracle, case), context="batch")
    assert llm.engine.num_steps > 12


def test_prefix_and_encoder_cache_hits_stay_exact(make_qwen3vl_llm, qwen3vl_oracle):
    """The same image in a later call is not encoded again; a prompt that shares text and image and
    differs just after it hits blocks that end inside the image, and the image's remaining rows
    (DeepStack levels included) come from the encoder cache. A different image at the same place
    gets no hit past its start."""
    block = 16
    image = _png(72, 72, 10)
    intro = "A shared introduction of some length. " * 4
    first, second = chat_case(intro, image, "First question?"), chat_case(intro, image, "Other?")
    other_image = chat_case(intro, _png(72, 72, 11), "Other?")
    llm = make_qwen3vl_llm(block_size=block)
    llm.generate([first.prompt], GREEDY_12)
    [item] = llm.preprocessor.preprocess(second.prompt).mm_items
    [result] = llm.generate([second.prompt], GREEDY_12)
    assert_tokens_match(result.token_ids, _oracle_tokens(qwen3vl_oracle, second), context="prefix hit inside the image")
    assert item.placeholder.offset < result.usage.cached_tokens < item.placeholder.end
    assert llm.engine.runner.vision.num_items_encoded == 1  # encoder-cache hit
    [again] = llm.generate([second.prompt], GREEDY_12)  # the whole prompt but its last block
    assert again.token_ids == result.token_ids
    assert again.usage.cached_tokens == (again.usage.prompt_tokens - 1) // block * block
    [result] = llm.generate([other_image.prompt], GREEDY_12)
    assert_tokens_match(result.token_ids, _oracle_tokens(qwen3vl_oracle, other_image), context="another image")
    assert result.usage.cached_tokens <= item.placeholder.offset
    assert llm.engine.runner.vision.num_items_encoded == 2
