"""Images exactly as users' transformers computes them: every family's image processor against
transformers' own ``AutoImageProcessor`` with real torchvision, built from the same checkpoint
directory (tests/reference_processors.py), bit for bit: pixel values, grids and placeholder
counts, for images that need a resize and images that do not, in every mode a decoder gives
(greyscale, palette, palette with transparency, RGBA, LA, CMYK JPEG, animated GIF), Gemma3 with
and without Pan-and-Scan, and the Hub layouts. Videos: tests/services/models/test_video.py."""

from __future__ import annotations

import io
import json

import pytest
import torch
from PIL import Image

from services.models.family import ImageOptions
from services.models.registry import resolve_model
from services.models.tensor_pixels import PIXEL_BACKEND
from services.preprocess.config import PreprocessConfig
from services.preprocess.image_decode import decode_image
from tests.factories import encode_image, make_image
from tests.reference_processors import reference_processors


def _animated_gif() -> bytes:
    frames = [make_image(90, 60, seed=s).convert("P") for s in (1, 2, 3)]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    return buffer.getvalue()


def _palette_with_transparency() -> bytes:
    image = make_image(70, 50, seed=4, mode="P")
    image.info["transparency"] = 3
    return encode_image(image, "PNG", transparency=3)


def _la() -> bytes:
    return encode_image(make_image(64, 40, seed=5, mode="RGBA").convert("LA"))


def _cmyk_jpeg() -> bytes:
    return encode_image(make_image(96, 64, seed=6).convert("CMYK"), "JPEG", quality=95)


# Encoded images, as clients send them: sizes that need a resize (most), one already at a
# multiple of 28 and 32, tiny and very wide ones, and every mode.
IMAGES = {
    "300x200": encode_image(make_image(300, 200, seed=1)),
    "1024x768 jpeg": encode_image(make_image(1024, 768, seed=2), "JPEG", quality=90),
    "448x448 (a multiple of 28 and 32)": encode_image(make_image(448, 448, seed=3)),
    "33x97": encode_image(make_image(33, 97, seed=4)),
    "12x9": encode_image(make_image(12, 9, seed=5)),
    "1200x100": encode_image(make_image(1200, 100, seed=6)),
    "greyscale": encode_image(make_image(200, 150, seed=7, mode="L")),
    "palette": encode_image(make_image(90, 120, seed=8, mode="P")),
    "palette with transparency": _palette_with_transparency(),
    "rgba": encode_image(make_image(120, 90, seed=9, mode="RGBA")),
    "la": _la(),
    "cmyk jpeg": _cmyk_jpeg(),
    "animated gif": _animated_gif(),
    "webp": encode_image(make_image(160, 100, seed=10), "WEBP", lossless=True),
}


@pytest.fixture(scope="module", params=["tiny", "gemma3-tiny", "gemma3-tiny pan-and-scan", "qwen3vl-tiny", "qwen2-vl-7b", "gemma-3-4b-it"])
def processors(request, tmp_path_factory):
    """(our image processor, the checkpoint directory, the processor call's settings)."""
    name, _, option = request.param.partition(" ")
    if name in ("qwen2-vl-7b", "gemma-3-4b-it"):
        from tests.hub_layouts import write_layout

        path = write_layout(name, tmp_path_factory.mktemp("layout"))
        model = resolve_model(str(path), progress=lambda _m: None)
    else:
        model = resolve_model(name, progress=lambda _m: None)
    pan_and_scan = option == "pan-and-scan" or None
    kwargs = {"do_pan_and_scan": True} if pan_and_scan else {}
    return model.family.image_processor(model.path, ImageOptions(do_pan_and_scan=pan_and_scan)), model.path, kwargs


def _one_image_prompt(model_dir) -> tuple[str, int]:
    """A prompt of one image placeholder, as the family's processor expands it, and the id of the
    image's placeholder token."""
    config = json.loads((model_dir / "config.json").read_text())
    if config["model_type"] == "gemma3":
        return "<start_of_image>", int(config["image_token_index"])
    return "<|vision_start|><|image_pad|><|vision_end|>", int(config["image_token_id"])


@pytest.mark.parametrize("case", list(IMAGES))
def test_pixels_grids_and_token_counts_equal_transformers_autoprocessor(processors, case):
    """The image in a one-image prompt through transformers' AutoProcessor (its image processor is
    the torchvision class), as users and vLLM build it, against our processor."""
    ours, model_dir, kwargs = processors
    data = IMAGES[case]
    text, image_token = _one_image_prompt(model_dir)
    theirs = reference_processors().process(model_dir, text, [Image.open(io.BytesIO(data))], **kwargs)
    assert theirs["backend"] in ("Qwen2VLImageProcessor", "Gemma3ImageProcessor")  # the torchvision classes, not *Pil
    processed = ours.process(decode_image(data, PreprocessConfig()))
    assert processed.pixel_values.shape == theirs["pixel_values"].shape, case
    difference = (processed.pixel_values - theirs["pixel_values"]).abs().max()
    assert torch.equal(processed.pixel_values, theirs["pixel_values"]), (case, difference)
    if "image_grid_thw" in theirs:
        assert processed.grid_thw == tuple(theirs["image_grid_thw"][0].tolist())
    assert processed.num_tokens == int((theirs["input_ids"] == image_token).sum())


def test_the_pixel_path_enters_every_items_hash():
    model = resolve_model("tiny", progress=lambda _m: None)
    assert model.family.image_processor(model.path, ImageOptions()).kwargs_for_hash["pixels"] == PIXEL_BACKEND
    gemma = resolve_model("gemma3-tiny", progress=lambda _m: None)
    assert gemma.family.image_processor(gemma.path, ImageOptions()).kwargs_for_hash["pixels"] == PIXEL_BACKEND
