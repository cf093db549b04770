"""Prefix KV and encoder caches: a hit may change speed, never output."""

from __future__ import annotations

from shared.hashing import MmSpan, block_hashes
from tests.factories import chat_case, encode_image, make_image
from tests.oracle import assert_tokens_match
from tests.services.engine.conftest import GREEDY_16, oracle_tokens

BLOCK = 16


def _png(w, h, seed):
    return encode_image(make_image(w, h, seed=seed))


def test_repeated_request_hits_both_caches_and_keeps_output(make_llm, oracle):
    llm = make_llm(block_size=BLOCK)
    case = chat_case(_png(224, 224, 1), "What is in this image?")
    [first] = llm.generate([case.prompt], GREEDY_16)
    encoded = llm.engine.runner.vision.num_items_encoded
    [second] = llm.generate([case.prompt], GREEDY_16)
    assert second.token_ids == first.token_ids
    assert_tokens_match(second.token_ids, oracle_tokens(oracle, case))
    assert first.usage.cached_tokens == 0
    assert second.usage.cached_tokens > 0
    assert second.usage.cached_tokens == (first.usage.prompt_tokens - 1) // BLOCK * BLOCK
    assert llm.engine.runner.vision.num_items_encoded == encoded == 1


def test_same_text_different_image_gets_no_kv_hit_in_image_blocks(make_llm, oracle):
    llm = make_llm(block_size=BLOCK)
    a = chat_case(_png(224, 224, 2), "Describe the picture.")
    b = chat_case(_png(224, 224, 3), "Describe the picture.")
    [result_a] = llm.generate([a.prompt], GREEDY_16)
    [result_b] = llm.generate([b.prompt], GREEDY_16)
    prep = llm.preprocessor.preprocess(b.prompt)
    image_start = prep.mm_items[0].placeholder.offset
    # Only whole blocks before the image may be shared.
    assert result_b.usage.cached_tokens == image_start // BLOCK * BLOCK
    assert_tokens_match(result_b.token_ids, oracle_tokens(oracle, b))
    assert llm.engine.runner.vision.num_items_encoded == 2
    assert result_a.token_ids != result_b.token_ids


def test_same_image_different_question_hits_encoder_and_kv_up_to_first_differing_block(make_llm, oracle):
    llm = make_llm(block_size=BLOCK)
    q1 = chat_case(_png(224, 224, 4), "What colour dominates?")
    q2 = chat_case(_png(224, 224, 4), "How many shapes are there?")
    llm.generate([q1.prompt], GREEDY_16)
    [result] = llm.generate([q2.prompt], GREEDY_16)
    assert llm.engine.runner.vision.num_items_encoded == 1  # encoder-cache hit
    ids1 = llm.preprocessor.preprocess(q1.prompt).prompt_token_ids
    ids2 = llm.preprocessor.preprocess(q2.prompt).prompt_token_ids
    first_diff = next(i for i, (x, y) in enumerate(zip(ids1, ids2)) if x != y)
    assert result.usage.cached_tokens == first_diff // BLOCK * BLOCK
    assert result.usage.cached_tokens > 0
    assert_tokens_match(result.token_ids, oracle_tokens(oracle, q2))


def test_mm_prefix_caching_mirrors_seed_000(make_llm):
    """vLLM's test_mm_prefix_caching: block hashes of a prompt with an image carry its mm_hash;
    identical tokens with another image hash differently; the engine's cache agrees."""
    llm = make_llm(block_size=BLOCK)
    prompt = chat_case(_png(112, 112, 5), "Describe.").prompt
    prep = llm.preprocessor.preprocess(prompt)
    item = prep.mm_items[0]
    spans = [MmSpan(item.mm_hash, item.placeholder)]
    hashes = block_hashes(prep.prompt_token_ids, BLOCK, spans)
    other = block_hashes(prep.prompt_token_ids, BLOCK, [MmSpan("bbb", item.placeholder)])
    first_image_block = item.placeholder.offset // BLOCK
    assert hashes[:first_image_block] == other[:first_image_block]
    assert all(h != o for h, o in zip(hashes[first_image_block:], other[first_image_block:]))
    llm.generate([prompt], GREEDY_16)
    pool = llm.engine.kv.pool
    cached_prompt_blocks = [h for h in hashes if pool.lookup(h) is not None]
    assert cached_prompt_blocks == hashes  # every full prompt block was cached under these hashes


def test_cache_salt_isolates_prefixes(make_llm):
    llm = make_llm(block_size=BLOCK)
    prompt = chat_case("A long enough shared system prompt " * 3).prompt
    llm.generate([prompt], GREEDY_16)
    [salted] = llm.generate([prompt], GREEDY_16, cache_salt="tenant-b")
    [again] = llm.generate([prompt], GREEDY_16)
    assert salted.usage.cached_tokens == 0
    assert again.usage.cached_tokens > 0
    assert salted.token_ids == again.token_ids
