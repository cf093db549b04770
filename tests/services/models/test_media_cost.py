"""The torch-free image cost models equal the families' real processors: the tokens they price an
image at, from its size alone, are the tokens processing it gives (Gemma3 with Pan-and-Scan: an
upper bound that is reached)."""

from __future__ import annotations

import pytest

from services.models.family import ImageOptions
from services.models.media_cost import ResizeCost, ViewCost, cost_model_from_json, cost_model_to_json
from services.models.registry import resolve_model
from tests.factories import make_image

SIZES = [(1, 1), (28, 28), (64, 48), (97, 301), (333, 20), (640, 480), (1023, 1), (1500, 1000), (56, 5000)]


@pytest.mark.parametrize("name", ["tiny", "qwen3vl-tiny", "gemma3-tiny"])
def test_the_cost_model_prices_an_image_at_the_tokens_processing_gives(name):
    model = resolve_model(name, progress=lambda _m: None)
    processor = model.family.image_processor(model.path, ImageOptions())
    cost = processor.cost_model()
    for width, height in SIZES:
        if max(width, height) / min(width, height) > 200:
            continue  # refused before processing
        assert cost.image_tokens(width, height) == processor.process(make_image(width, height)).num_tokens, (width, height)
    assert cost_model_from_json(cost_model_to_json(cost)) == cost


def test_resize_cost_equals_transformers_smart_resize():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    cost = ResizeCost(patch_size=14, merge_size=2, min_pixels=3136, max_pixels=200_000)
    for width, height in [*SIZES, (7, 3000), (1500, 1500)]:
        if max(width, height) / min(width, height) > 200:
            continue
        h, w = smart_resize(height, width, factor=28, min_pixels=3136, max_pixels=200_000)
        assert cost.image_tokens(width, height) == (h // 14) * (w // 14) // 4
    assert cost.max_image_tokens == 200_000 // 28**2


def test_gemma3_with_pan_and_scan_prices_wide_images_at_their_most_crops():
    model = resolve_model("gemma3-tiny", progress=lambda _m: None)
    processor = model.family.image_processor(model.path, ImageOptions(do_pan_and_scan=True))
    cost = processor.cost_model()
    assert isinstance(cost, ViewCost) and cost.max_num_crops >= 2
    for width, height in [(64, 64), (400, 100), (100, 900)]:
        assert cost.image_tokens(width, height) >= processor.process(make_image(width, height)).num_tokens
    assert cost.image_tokens(64, 64) == cost.tokens_per_view
