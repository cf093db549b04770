"""Prefix KV pages exported by one engine and imported by another: the importer adopts them as a
prefix hit and its output equals the oracle (a remote-KV cache path)."""

from __future__ import annotations

from services.engine import connector
from shared.hashing import MmSpan, block_hashes
from tests.factories import chat_case, encode_image, make_image
from tests.oracle import assert_tokens_match
from tests.services.engine.conftest import GREEDY_16, oracle_tokens

BLOCK = 16


def _hashes(llm, prompt):
    prep = llm.preprocessor.preprocess(prompt)
    spans = [MmSpan(i.mm_hash, i.placeholder) for i in prep.mm_items]
    return prep, block_hashes(prep.prompt_token_ids, BLOCK, spans)


def test_imported_prefix_is_a_cache_hit_with_identical_output(make_llm, oracle):
    source, puller = make_llm(block_size=BLOCK), make_llm(block_size=BLOCK)
    case = chat_case(encode_image(make_image(112, 84, seed=41)), "What is shown here?")
    [expected] = source.generate([case.prompt], GREEDY_16)
    prep, hashes = _hashes(source, case.prompt)
    assert connector.num_cached_blocks(source.engine, hashes) == len(hashes)
    pages = connector.export_prefix(source.engine, hashes)
    assert pages.num_blocks == len(hashes)

    assert connector.import_blocks(puller.engine, hashes, pages) == len(hashes)
    assert connector.import_blocks(puller.engine, hashes, pages) == 0  # already held: nothing rewritten
    [result] = puller.generate([case.prompt], GREEDY_16)
    assert result.usage.cached_tokens == (len(prep.prompt_token_ids) - 1) // BLOCK * BLOCK
    assert result.token_ids == expected.token_ids
    assert_tokens_match(result.token_ids, oracle_tokens(oracle, case))


def test_export_stops_at_first_missing_block(make_llm):
    llm = make_llm(block_size=BLOCK)
    case = chat_case(encode_image(make_image(224, 224, seed=42)), "Describe.")
    llm.generate([case.prompt], GREEDY_16)
    _, hashes = _hashes(llm, case.prompt)
    broken = [*hashes[:2], "0" * 64, *hashes[3:]]
    assert connector.num_cached_blocks(llm.engine, broken) == 2
    assert connector.export_prefix(llm.engine, broken).num_blocks == 2
    assert connector.export_prefix(llm.engine, ["0" * 64]).num_blocks == 0


def test_partial_import_of_a_prefix_still_matches_oracle(make_llm, oracle):
    """Only the first blocks arrive (a peer held less): the rest is recomputed, output unchanged."""
    source, puller = make_llm(block_size=BLOCK), make_llm(block_size=BLOCK)
    case = chat_case(encode_image(make_image(224, 224, seed=43)), "Which colours appear?")
    source.generate([case.prompt], GREEDY_16)
    _, hashes = _hashes(source, case.prompt)
    pages = connector.export_prefix(source.engine, hashes[:3])
    assert connector.import_blocks(puller.engine, hashes[:3], pages) == 3
    [result] = puller.generate([case.prompt], GREEDY_16)
    assert result.usage.cached_tokens == 3 * BLOCK
    assert_tokens_match(result.token_ids, oracle_tokens(oracle, case))
