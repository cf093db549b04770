"""The torch-free image cost models equal the families' real processors: the tokens they price an
image at, from its size alone, are the tokens processing it gives (Gemma3 with Pan-and-Scan: an
upper bound that is reached)."""

from __future__ import annotations

import pytest

from services.models.family import ImageOptions
from services.models.media_cost import (
    ResizeCost,
    ViewCost,
    cost_model_from_json,
    cost_model_to_json,
    media_costs_from_json,
    media_costs_to_json,
)
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


# (frames, fps, width, height, the request's video settings)
CLIPS = [
    (30, 10, 64, 48, {}),
    (9, 3, 96, 40, {}),
    (40, 20, 56, 56, {"fps": 4.0}),
    (24, 8, 64, 64, {"num_frames": 6}),
    (50, 25, 120, 90, {"max_frames": 4, "max_pixels": 8000}),
]


@pytest.mark.parametrize("name", ["tiny", "qwen3vl-tiny", "qwen3-vl-2b"])
def test_the_clip_cost_read_from_the_header_bounds_the_tokens_processing_gives(name, tmp_path):
    """Exact for Qwen2-VL's sampler where the frames fill whole groups; never below. The Qwen3-VL
    built-in has no video processor file, so transformers gives it Qwen2-VL's rule; the Hub's
    Qwen3-VL layout names Qwen3VLVideoProcessor, whose whole-clip budget the cost follows."""
    from services.gateway.frontend.clip_header import clip_header
    from services.preprocess.config import PreprocessConfig
    from services.preprocess.preprocessor import Preprocessor
    from tests.factories import Video, chat_case, make_clip
    from tests.hub_layouts import write_layout

    model = resolve_model(str(write_layout(name, tmp_path / name)) if name == "qwen3-vl-2b" else name, progress=lambda _m: None)
    preprocessor = Preprocessor(model, PreprocessConfig())
    costs = media_costs_from_json(media_costs_to_json(preprocessor.media_costs()))
    assert costs.video is not None and costs.video.clip_pixel_budget == (name == "qwen3-vl-2b")
    for frames, fps, width, height, options in CLIPS:
        data = make_clip(frames, fps, width, height)
        header = clip_header(data)
        assert header is not None and (header.num_frames, header.width, header.height) == (frames, width, height)
        assert header.fps == pytest.approx(fps)
        processed = preprocessor.preprocess(chat_case(Video(data), "?", mm_processor_kwargs=options).prompt)
        actual = sum(item.placeholder.length for item in processed.mm_items)
        priced = costs.video.clip_tokens(header.num_frames, header.fps, header.width, header.height, options)
        group = priced // max(1, len(processed.mm_items))
        assert actual <= priced <= actual + group, (frames, fps, width, height, options, priced, actual)


def test_a_header_is_read_only_from_iso_media_files():
    from services.gateway.frontend.clip_header import clip_header
    from tests.factories import make_clip

    assert clip_header(b"") is None and clip_header(b"\x00\x00\x00\x08moov") is None
    assert clip_header(make_clip(4, 2, container="matroska", codec="ffv1")) is None
    truncated = make_clip(8, 4)
    for cut in range(0, len(truncated), 97):  # a cut file never raises: it has no header, or a whole one
        clip_header(truncated[:cut])
