"""Processor cache: byte budget never exceeded, LRU order, and hits skip the image processor."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from services.gateway.frontend.prompt_wire import prompt_for_library
from services.models.family import ProcessedImage
from services.preprocess.preprocessor import Preprocessor
from services.preprocess.processor_cache import ProcessorCache
from shared.types import MmHash
from tests.factories import image_data_url, make_image


def _item(num_floats: int) -> ProcessedImage:
    return ProcessedImage(pixel_values=torch.zeros(num_floats), grid_thw=(1, 2, 2), num_tokens=1)


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(min_value=0, max_value=4096),
    ops=st.lists(st.tuples(st.sampled_from("pg"), st.integers(0, 15), st.integers(1, 400)), max_size=120),
)
def test_cache_never_exceeds_its_byte_budget(capacity, ops):
    cache = ProcessorCache(capacity)
    for op, key, size in ops:
        mm_hash = MmHash(f"h{key}")
        if op == "p":
            stored = cache.put(mm_hash, _item(size))
            assert stored == (size * 4 <= capacity)
        else:
            cache.get(mm_hash)
        total = sum(item.num_bytes for item in cache._hash_to_item.values())
        assert total == cache.stats.num_bytes <= capacity


def test_cache_evicts_least_recently_used_first():
    cache = ProcessorCache(capacity_bytes=3 * 400)
    for key in "abc":
        cache.put(MmHash(key), _item(100))
    assert cache.get(MmHash("a")) is not None  # a becomes most recent
    cache.put(MmHash("d"), _item(100))
    assert MmHash("b") not in cache
    assert all(MmHash(k) in cache for k in "acd")
    assert cache.stats.num_evictions == 1


def test_oversized_item_is_not_cached_and_flushes_nothing():
    cache = ProcessorCache(capacity_bytes=800)
    cache.put(MmHash("small"), _item(100))
    assert not cache.put(MmHash("huge"), _item(1000))
    assert MmHash("small") in cache and MmHash("huge") not in cache


def test_second_identical_image_skips_the_image_processor(tiny_model):
    preprocessor = Preprocessor(tiny_model)
    url = image_data_url(make_image(300, 200, seed=11))
    prompt = prompt_for_library({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]})
    first = preprocessor.preprocess(prompt)
    processed_after_first = preprocessor.image_processor.num_processed
    second = preprocessor.preprocess(prompt)
    assert preprocessor.image_processor.num_processed == processed_after_first == 1
    assert not first.mm_items[0].processor_cache_hit and second.mm_items[0].processor_cache_hit
    assert preprocessor.processor_cache.stats.num_hits == 1
    assert preprocessor.processor_cache.stats.num_misses == 1
    assert torch.equal(first.mm_items[0].image.pixel_values, second.mm_items[0].image.pixel_values)
    assert first.prompt_token_ids == second.prompt_token_ids


def test_preprocessor_cache_respects_budget_under_random_images(tiny_model):
    from services.preprocess.config import PreprocessConfig

    budget = 600_000
    preprocessor = Preprocessor(tiny_model, PreprocessConfig(processor_cache_bytes=budget))
    rng = torch.Generator().manual_seed(0)
    for _ in range(25):
        seed = int(torch.randint(0, 6, (1,), generator=rng))
        width = int(torch.randint(28, 200, (1,), generator=rng))
        url = image_data_url(make_image(width, 100, seed=seed))
        image = {"type": "image_url", "image_url": {"url": url}}
        preprocessor.preprocess(prompt_for_library({"messages": [{"role": "user", "content": [image]}]}))
        assert preprocessor.processor_cache.stats.num_bytes <= budget
    assert preprocessor.processor_cache.stats.num_evictions > 0


def test_bounded_memo_keeps_at_most_its_entries_in_lru_order():
    from services.preprocess.processor_cache import BoundedMemo

    memo: BoundedMemo[str, int] = BoundedMemo(2)
    memo.put("a", 1)
    memo.put("b", 2)
    assert memo.get("a") == 1
    memo.put("c", 3)
    assert len(memo) == 2 and memo.get("b") is None and memo.get("a") == 1 and memo.get("c") == 3
    disabled: BoundedMemo[str, int] = BoundedMemo(0)
    disabled.put("a", 1)
    assert disabled.get("a") is None


def test_exact_repeat_skips_decoding_but_same_pixels_new_file_still_hit(tiny_model, monkeypatch):
    from services.preprocess import image_identity as module

    preprocessor = Preprocessor(tiny_model)
    image = make_image(100, 80, seed=12)
    png_url = image_data_url(image, "PNG")
    body = lambda url: prompt_for_library({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]})  # noqa: E731
    first = preprocessor.preprocess(body(png_url))
    calls = []
    real_decode = module.decode_image
    monkeypatch.setattr(module, "decode_image", lambda *a: calls.append(1) or real_decode(*a))
    again = preprocessor.preprocess(body(png_url))
    assert calls == [] and again.mm_items[0].mm_hash == first.mm_items[0].mm_hash
    from tests.factories import data_url, encode_image

    webp = preprocessor.preprocess(body(data_url(encode_image(image, "WEBP", lossless=True), "image/webp")))
    assert calls == [1] and webp.mm_items[0].processor_cache_hit
    assert webp.mm_items[0].mm_hash == first.mm_items[0].mm_hash
