"""The hashing contract: canonical, process-independent, and sensitive to every input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from shared.hashing import canonical_bytes, digest_hex, mm_hash_of_pixels

KWARGS = {"min_pixels": 3136, "max_pixels": 12845056, "merge_size": 2}


def _pixels_hash(pixels: bytes, *, model_id="tessera-tiny", kwargs=KWARGS, size=(4, 2), mode="RGB"):
    return mm_hash_of_pixels(model_id=model_id, modality="image", mode=mode, size=size, pixel_bytes=pixels, processor_kwargs=kwargs)


def test_canonical_bytes_is_key_order_independent():
    assert canonical_bytes({"a": 1, "b": [1, "x"]}) == canonical_bytes({"b": [1, "x"], "a": 1})


@pytest.mark.parametrize(
    "left,right",
    [
        (1, "1"),
        (True, 1),
        (b"ab", "ab"),
        (["ab", "c"], ["a", "bc"]),
        ([1, [2]], [[1], 2]),
        ({"a": None}, {"a": 0}),
        ((1, 2), (1, 2, None)),
    ],
)
def test_canonical_bytes_distinguishes_distinct_values(left, right):
    assert canonical_bytes(left) != canonical_bytes(right)


def test_canonical_bytes_rejects_unserializable_values():
    with pytest.raises(TypeError):
        canonical_bytes(object())


def test_mm_hash_differs_for_different_pixels_model_kwargs_mode_or_size():
    pixels = bytes(range(24))
    base = _pixels_hash(pixels)
    assert _pixels_hash(pixels) == base
    assert _pixels_hash(bytes(range(1, 25))) != base
    assert _pixels_hash(pixels, model_id="tessera-small") != base
    assert _pixels_hash(pixels, kwargs={**KWARGS, "max_pixels": 1003520}) != base
    assert _pixels_hash(pixels, size=(2, 4)) != base
    assert _pixels_hash(pixels, mode="RGBX", size=(3, 2)) != base


_CHILD = """
import json, sys
from shared.hashing import digest_hex, mm_hash_of_pixels
print(json.dumps([
    mm_hash_of_pixels(model_id="tessera-tiny", modality="image", mode="RGB", size=(4, 2),
                      pixel_bytes=bytes(range(24)), processor_kwargs={"merge_size": 2, "min_pixels": 3136, "max_pixels": 12845056}),
    digest_hex({"z": [1, 2.5, "x"], "a": None}),
]))
"""


def test_hashes_are_equal_across_separate_processes():
    here = [_pixels_hash(bytes(range(24))), digest_hex({"a": None, "z": [1, 2.5, "x"]})]
    for seed in ("0", "12345"):  # a different PYTHONHASHSEED must not matter
        out = subprocess.run(
            [sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": seed, "PATH": ""}
        )
        assert json.loads(out.stdout) == here
