"""Block hashes: chained, full blocks only, and keyed by images, salt and LoRA."""

from __future__ import annotations

import subprocess
import sys

from shared.hashing import (
    ROOT_BLOCK_HASH,
    MmSpan,
    block_extra_keys,
    block_hashes,
    extend_block_hashes,
    hash_block,
)
from shared.types import PlaceholderRange

BLOCK = 4


def _span(mm_hash: str, offset: int, length: int) -> MmSpan:
    return MmSpan(mm_hash, PlaceholderRange(offset, length))


def test_only_full_blocks_are_hashed_and_chained_from_the_fixed_root():
    tokens = list(range(10))
    hashes = block_hashes(tokens, BLOCK)
    assert len(hashes) == 2
    assert hashes[0] == hash_block(ROOT_BLOCK_HASH, tokens[:4])
    assert hashes[1] == hash_block(hashes[0], tokens[4:8])


def test_seed_000_mm_prefix_caching():
    """Same tokens + different image -> different hash; same tokens + same image -> same hash."""
    common = [1, 2, 3] + [151655] * 6 + [7, 8, 9]  # image tokens at [3, 9)
    req0 = block_hashes(common, BLOCK, [_span("aaa", 3, 6)])
    req1 = block_hashes(common, BLOCK, [_span("bbb", 3, 6)])
    req2 = block_hashes(common, BLOCK, [_span("aaa", 3, 6)])
    assert req0[0] == hash_block(ROOT_BLOCK_HASH, common[:4], (("mm", "aaa", 0),))
    assert req0 == req2
    assert all(a != b for a, b in zip(req0, req1))  # every block from the first image block on


def test_blocks_before_an_image_are_shared_and_offsets_are_per_block():
    tokens = [1, 2, 3, 4, 5] + [151655] * 8 + [6, 7, 8]
    a = block_hashes(tokens, BLOCK, [_span("aaa", 5, 8)])
    b = block_hashes(tokens, BLOCK, [_span("bbb", 5, 8)])
    assert a[0] == b[0]  # block 0 holds only text
    assert a[1] != b[1]
    spans = [_span("aaa", 5, 8)]
    assert block_extra_keys(1, BLOCK, spans) == (("mm", "aaa", 0),)
    assert block_extra_keys(2, BLOCK, spans) == (("mm", "aaa", 3),)
    assert block_extra_keys(3, BLOCK, spans) == (("mm", "aaa", 7),)


def test_salt_keys_only_the_first_block_and_lora_keys_every_block():
    tokens = list(range(12))
    plain = block_hashes(tokens, BLOCK)
    salted = block_hashes(tokens, BLOCK, cache_salt="tenant-a")
    assert all(p != s for p, s in zip(plain, salted))  # block 0 differs, so its children do too
    assert block_extra_keys(0, BLOCK, cache_salt="s") == (("salt", "s"),)
    assert block_extra_keys(1, BLOCK, cache_salt="s") == ()
    assert block_extra_keys(1, BLOCK, lora_name="l") == (("lora", "l"),)
    # A salt and an image id with the same text never collide.
    assert hash_block(ROOT_BLOCK_HASH, [1], (("salt", "x"),)) != hash_block(ROOT_BLOCK_HASH, [1], (("mm", "x", 0),))


def test_incremental_extension_equals_full_hashing():
    tokens = list(range(23))
    spans = [_span("img", 2, 9)]
    partial = block_hashes(tokens[:9], BLOCK, spans)
    assert extend_block_hashes(partial, tokens, BLOCK, spans) == block_hashes(tokens, BLOCK, spans)


def test_block_hashes_are_equal_across_processes():
    code = (
        "from shared.hashing import MmSpan, block_hashes; from shared.types import PlaceholderRange;"
        "print(block_hashes(list(range(17)), 4, [MmSpan('aaa', PlaceholderRange(2, 5))], cache_salt='s'))"
    )
    here = block_hashes(list(range(17)), 4, [_span("aaa", 2, 5)], cache_salt="s")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "7"})
    assert out.stdout.strip() == str(here)


def test_fast_block_encoding_equals_the_canonical_serialization():
    import random

    from shared.hashing import digest_hex

    rng = random.Random(0)
    for _ in range(200):
        tokens = [rng.randrange(0, 200_000) for _ in range(rng.randrange(0, 20))]
        extra = tuple(("mm", f"h{rng.randrange(9)}", rng.randrange(100)) for _ in range(rng.randrange(0, 3)))
        parent = ROOT_BLOCK_HASH if rng.random() < 0.5 else hash_block(ROOT_BLOCK_HASH, [1, 2])
        assert hash_block(parent, tokens, extra) == digest_hex((parent, tuple(tokens), extra))


def _canonical_block_hashes(tokens, block_size, spans, cache_salt=None, lora_name=None):
    """The contract spelled out with the generic serializer: the fast path must equal it."""
    from shared.hashing import digest_hex

    hashes, parent = [], ROOT_BLOCK_HASH
    for index in range(len(tokens) // block_size):
        extra = block_extra_keys(index, block_size, spans, cache_salt=cache_salt, lora_name=lora_name)
        parent = digest_hex((parent, tuple(tokens[index * block_size : (index + 1) * block_size]), extra))
        hashes.append(parent)
    return hashes


def test_fast_block_hashes_equal_the_canonical_definition():
    import random

    rng = random.Random(1)
    for _ in range(300):
        block_size = rng.choice([1, 2, 4, 16])
        tokens = [rng.randrange(0, 200_000) for _ in range(rng.randrange(0, 70))]
        # Overlapping, adjacent, empty and out-of-prompt spans, in no particular order.
        spans = [_span(f"img{rng.randrange(5)}", rng.randrange(-3, 75), rng.randrange(0, 30)) for _ in range(rng.randrange(0, 4))]
        salt = rng.choice([None, "", "tenant-é"])
        lora = rng.choice([None, "adapter"])
        expected = _canonical_block_hashes(tokens, block_size, spans, salt, lora)
        assert block_hashes(tokens, block_size, spans, cache_salt=salt, lora_name=lora) == expected
        done = rng.randrange(0, len(expected) + 1)
        assert extend_block_hashes(expected[:done], tokens, block_size, spans, cache_salt=salt, lora_name=lora) == expected
