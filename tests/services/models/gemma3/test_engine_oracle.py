"""Gemma3 (tiny built-in): greedy float32 output equals transformers' generate token for token,
on every in-engine path: image placement, several images, multi-turn, chunked prefill around
images, prompts past the sliding window, prefix and encoder-cache hits (also a hit that ends
inside an image), and Pan-and-Scan."""

from __future__ import annotations

import pytest

from services.engine.sampling_params import SamplingParams
from tests.factories import chat_case, conversation, encode_image, make_image
from tests.oracle import ReferenceOracle, assert_tokens_match

GREEDY_12 = SamplingParams(max_tokens=12, ignore_eos=True)


def _png(w, h, seed):
    return encode_image(make_image(w, h, seed=seed))


def _oracle_tokens(oracle: ReferenceOracle, case, max_new_tokens: int = 12) -> object:
    return oracle.generate(oracle.process(oracle.chat_text(case.oracle_messages), case.images), max_new_tokens)


LONG_TEXT = " ".join(f"word{i}" for i in range(60))  # past the tiny model's 32-token sliding window

CASES = {
    "text_only": lambda: chat_case("Describe the weather in one sentence."),
    "long_text_past_window": lambda: chat_case(LONG_TEXT, "Summarise."),
    "one_image": lambda: chat_case(_png(112, 112, 1), "What is in this image?"),
    "two_images": lambda: chat_case(_png(56, 56, 2), "one", _png(84, 56, 3), "two"),
    "image_at_start": lambda: chat_case(_png(98, 70, 4), "and tell me what you see."),
    "image_in_middle": lambda: chat_case("Look closely at", _png(98, 70, 5), "and tell me what you see."),
    "image_at_end": lambda: chat_case("What is this?", _png(98, 70, 6)),
    "image_after_long_text": lambda: chat_case(LONG_TEXT, _png(64, 64, 7), "Describe it."),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_single_request_matches_oracle(name, make_gemma3_llm, gemma3_oracle):
    case = CASES[name]()
    [result] = make_gemma3_llm().generate([case.prompt], GREEDY_12)
    assert_tokens_match(result.token_ids, _oracle_tokens(gemma3_oracle, case), context=name)
    oracle_inputs = gemma3_oracle.process(gemma3_oracle.chat_text(case.oracle_messages), case.images)
    assert result.usage.prompt_tokens == len(oracle_inputs.token_ids)


def test_multi_turn_with_a_repeated_image_matches_oracle(make_gemma3_llm, gemma3_oracle):
    image = _png(80, 80, 8)
    first = chat_case(image, "What is this?")
    second = conversation(first, "A pattern.", chat_case(image, "And again?"))
    llm = make_gemma3_llm()
    for case in (first, second):  # the second turn hits the first's prefix and its image
        [result] = llm.generate([case.prompt], GREEDY_12)
        assert_tokens_match(result.token_ids, _oracle_tokens(gemma3_oracle, case), context="multi-turn")
    assert result.usage.cached_tokens > 0


def test_batch_in_flight_with_chunked_prefill_never_splits_an_image(make_gemma3_llm, gemma3_oracle):
    cases = [CASES[name]() for name in ("one_image", "image_after_long_text", "two_images", "text_only", "long_text_past_window")]
    llm = make_gemma3_llm(max_num_batched_tokens=80)  # an image is 64 tokens: chunks must cut around it
    assert llm.engine.config.disable_chunked_mm_input  # forced for this family
    results = llm.generate([c.prompt for c in cases], GREEDY_12)
    for case, result in zip(cases, results):
        assert_tokens_match(result.token_ids, _oracle_tokens(gemma3_oracle, case), context="chunked")
    assert llm.engine.num_steps > 12


def test_an_image_longer_than_the_step_budget_is_rejected(make_gemma3_llm):
    from services.engine.engine import RequestRejectedError

    with pytest.raises(RequestRejectedError, match="disable_chunked_mm_input"):
        make_gemma3_llm(max_num_batched_tokens=32).generate([chat_case(_png(64, 64, 9), "Hi").prompt], GREEDY_12)


@pytest.mark.parametrize("budget", [2048, 80], ids=["whole_step", "chunks_of_80"])
def test_a_prefix_hit_ending_inside_an_image_stays_exact_and_another_image_gets_no_false_hit(budget, make_gemma3_llm, gemma3_oracle):
    """Two prompts share text and an image, then differ just after it: with 16-token blocks the
    shared blocks end inside the image's 64-token span. The hit is kept (as vLLM keeps it: the
    cached KV was computed with the whole image in view, after the same prefix), the rest of the
    image runs in one chunk, and the output is exact. A different image of the same size at the
    same place has the same placeholder tokens but another mm_hash: no block past its start hits."""
    image = _png(72, 72, 10)
    intro = "A shared introduction of some length. " * 4
    first, second = chat_case(intro, image, "First question?"), chat_case(intro, image, "Other?")
    other_image = chat_case(intro, _png(72, 72, 11), "Other?")
    llm = make_gemma3_llm(block_size=16, max_num_batched_tokens=budget)
    llm.generate([first.prompt], GREEDY_12)
    [item] = llm.preprocessor.preprocess(second.prompt).mm_items
    [result] = llm.generate([second.prompt], GREEDY_12)
    assert_tokens_match(result.token_ids, _oracle_tokens(gemma3_oracle, second), context="prefix mid-image")
    assert item.placeholder.offset < result.usage.cached_tokens < item.placeholder.end  # the hit ends inside the image
    [result] = llm.generate([other_image.prompt], GREEDY_12)
    assert_tokens_match(result.token_ids, _oracle_tokens(gemma3_oracle, other_image), context="another image")
    assert result.usage.cached_tokens <= item.placeholder.offset


def test_pan_and_scan_matches_oracle(make_gemma3_llm, gemma3_model):
    oracle = ReferenceOracle(gemma3_model.path, do_pan_and_scan=True)
    case = chat_case(_png(1200, 400, 11), "Describe the wide picture.")  # 3:1, crops of 400x400
    llm = make_gemma3_llm(pan_and_scan=True)
    prep = llm.preprocessor.preprocess(case.prompt)
    assert len(prep.mm_items) > 1  # the full view and its crops, one span each
    [result] = llm.generate([case.prompt], GREEDY_12)
    assert_tokens_match(result.token_ids, _oracle_tokens(oracle, case), context="pan-and-scan")
    assert result.usage.prompt_tokens == len(oracle.process(oracle.chat_text(case.oracle_messages), case.images).token_ids)


def test_pan_and_scan_setting_is_part_of_mm_hash(make_gemma3_llm):
    prompt = chat_case(_png(64, 64, 12), "x").prompt
    plain = make_gemma3_llm().preprocessor.preprocess(prompt).mm_items[0].mm_hash
    scanned = make_gemma3_llm(pan_and_scan=True).preprocessor.preprocess(prompt).mm_items[0].mm_hash
    assert plain != scanned


def test_sliding_layers_hold_only_their_window_and_stay_exact(make_gemma3_llm, gemma3_oracle):
    """A prompt several windows long (the tiny model's window is 32): with sliding_window_kv its
    three sliding layers keep only the pages the window can reach, the global layer every page;
    output equals the oracle either way. Counted in layer pages (a page of the uniform layout
    spans all four layers)."""
    case = chat_case(LONG_TEXT, _png(64, 64, 13), LONG_TEXT, "Summarise.")
    expected = _oracle_tokens(gemma3_oracle, case)
    held = {}
    for windowed in (False, True):
        llm = make_gemma3_llm(sliding_window_kv=windowed, max_num_batched_tokens=64)
        pool, layers_per_page = llm.engine.kv.pool, len(llm.engine.runner.kv_caches)

        def count(request, pool=pool, windowed=windowed, layers_per_page=layers_per_page) -> None:  # before its pages are freed
            held[windowed] = (pool.num_blocks - pool.num_free_blocks) * layers_per_page

        llm.engine.finish_listeners.append(count)
        [result] = llm.generate([case.prompt], GREEDY_12)
        assert_tokens_match(result.token_ids, expected, context=f"sliding_window_kv={windowed}")
    num_blocks = -(-(result.usage.prompt_tokens + 11) // 16)
    assert held[False] == 4 * num_blocks
    assert num_blocks + 3 * 2 <= held[True] <= num_blocks + 3 * 3
