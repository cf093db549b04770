"""Which images a prefill node's cached prefix covers (services/router/coverage.py)."""

from __future__ import annotations

from services.router.coverage import covered_images
from shared.types import MmHash, PlaceholderRange

IMAGES = [(MmHash("a"), PlaceholderRange(4, 20)), (MmHash("b"), PlaceholderRange(40, 30)), (MmHash("c"), PlaceholderRange(90, 6))]


def test_an_image_is_covered_only_when_the_prefix_reaches_its_end():
    assert covered_images(IMAGES, 64, 200, 16) == {"a"}  # b ends at 70: cut by the prefix
    assert covered_images(IMAGES, 80, 200, 16) == {"a", "b"}
    assert covered_images(IMAGES, 0, 200, 16) == frozenset()


def test_the_engines_cap_applies_the_last_prompt_token_is_always_computed():
    # A 96-token prompt: the engine reuses at most (96 - 1) // 16 = 5 blocks, 80 tokens, so c
    # (ending at 96) is read though the index says all 96 tokens are cached.
    assert covered_images(IMAGES, 96, 96, 16) == {"a", "b"}
    assert covered_images(IMAGES, 112, 97, 16) == {"a", "b", "c"}
