"""Incremental detokenization equals the full decode after every token, on every built-in's
tokenizer: multi-byte characters split across tokens, special tokens skipped, EOS left out."""

from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer

from services.engine.detokenizer import DetokenizerState, IncrementalDetokenizer
from services.models.registry import resolve_model

TEXT = "Grüße, 世界! naïve café — 🙂🚀 x²+y² ≤ 1\n\ttabs  and   spaces, ÅÄÖ ñ ç 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 end."


@pytest.fixture(scope="module", params=["tiny", "gemma3-tiny", "qwen3vl-tiny"])
def tokenizer(request):
    return AutoTokenizer.from_pretrained(str(resolve_model(request.param, progress=lambda _m: None).path))


def sequences(tokenizer) -> list[list[int]]:
    rng = random.Random(0)
    encoded = tokenizer.encode(TEXT, add_special_tokens=False)
    special = list(tokenizer.all_special_ids)
    random_ids = [rng.randrange(tokenizer.vocab_size) for _ in range(200)]
    mixed = [t for pair in zip(encoded, rng.choices(special, k=len(encoded))) for t in pair]
    # A multi-byte character's bytes as separate tokens (byte-level BPE, byte fallback).
    return [encoded, random_ids, mixed, encoded[::-1]]


def test_incremental_text_equals_the_full_decode_after_every_token(tokenizer):
    eos = frozenset(t for t in (tokenizer.eos_token_id,) if t is not None)
    detokenizer = IncrementalDetokenizer(tokenizer, eos)
    for ids in sequences(tokenizer):
        state = DetokenizerState()
        for n in range(1, len(ids) + 1):
            full = tokenizer.decode([t for t in ids[:n] if t not in eos], skip_special_tokens=True)
            assert detokenizer.text(state, ids[:n]) == full, (n, ids[:n])


def test_tokens_given_at_once_catch_up_in_one_call(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer, frozenset())
    assert detokenizer.text(DetokenizerState(), ids) == tokenizer.decode(ids, skip_special_tokens=True)


def test_the_rust_decode_is_used_only_without_space_clean_up(tokenizer):
    assert IncrementalDetokenizer(tokenizer, frozenset())._decode == tokenizer.backend_tokenizer.decode
    tokenizer.clean_up_tokenization_spaces = True  # transformers' decode would then post-process
    try:
        assert IncrementalDetokenizer(tokenizer, frozenset())._decode == tokenizer.decode
    finally:
        tokenizer.clean_up_tokenization_spaces = False
