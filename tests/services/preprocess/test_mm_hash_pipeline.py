"""mm_hash as the preprocessor computes it, end to end from request bytes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from services.gateway.frontend.prompt_wire import prompt_for_library
from services.preprocess.config import PreprocessConfig
from services.preprocess.preprocessor import Preprocessor
from services.preprocess.prompt import Prompt
from tests.factories import data_url, encode_image, image_data_url, make_image


def _request(image_url: str, text: str = "Describe the picture", uuid: str | None = None) -> Prompt:
    part = {"type": "image_url", "image_url": {"url": image_url}}
    if uuid is not None:
        part["uuid"] = uuid
    return prompt_for_library({"messages": [{"role": "user", "content": [part, {"type": "text", "text": text}]}]})


@pytest.fixture()
def preprocessor(tiny_model):
    return Preprocessor(tiny_model)


def test_same_text_different_image_gives_different_hash(preprocessor):
    """Seed 000's scenario: req1 and req2 share text, differ in image; req3 reuses image 1."""
    image1, image2 = image_data_url(make_image(96, 96, seed=1)), image_data_url(make_image(96, 96, seed=2))
    req1 = preprocessor.preprocess(_request(image1, "Describe the picture"))
    req2 = preprocessor.preprocess(_request(image2, "Describe the picture"))
    req3 = preprocessor.preprocess(_request(image1, "Analyse the picture"))
    assert req1.prompt_token_ids == req2.prompt_token_ids
    assert req1.mm_items[0].mm_hash != req2.mm_items[0].mm_hash
    assert req1.mm_items[0].mm_hash == req3.mm_items[0].mm_hash


def test_same_pixels_in_different_containers_hash_equal(preprocessor):
    image = make_image(80, 60, seed=3)
    png = preprocessor.preprocess(_request(image_data_url(image, "PNG")))
    # Lossless WebP decodes to the same pixels as PNG: identity follows pixels, not file bytes.
    webp = preprocessor.preprocess(_request(data_url(encode_image(image, "WEBP", lossless=True), "image/webp")))
    assert png.mm_items[0].mm_hash == webp.mm_items[0].mm_hash
    assert webp.mm_items[0].processor_cache_hit


def test_palette_is_part_of_the_identity(preprocessor):
    a = make_image(50, 50, seed=4, mode="P")
    b = a.copy()
    b.putpalette([255 - v for v in a.getpalette()])
    ha = preprocessor.preprocess(_request(image_data_url(a))).mm_items[0].mm_hash
    hb = preprocessor.preprocess(_request(image_data_url(b))).mm_items[0].mm_hash
    assert ha != hb


def test_processor_kwargs_change_the_hash(tiny_model):
    url = image_data_url(make_image(500, 500, seed=5))
    default = Preprocessor(tiny_model).preprocess(_request(url)).mm_items[0]
    smaller = Preprocessor(tiny_model, PreprocessConfig(max_pixels=128 * 28 * 28)).preprocess(_request(url)).mm_items[0]
    assert default.mm_hash != smaller.mm_hash
    assert smaller.image.num_tokens < default.image.num_tokens


def test_a_client_uuid_names_the_image_by_its_content_never_by_itself(preprocessor):
    url = image_data_url(make_image(64, 64, seed=6))
    named = preprocessor.preprocess(_request(url, uuid="product-42"))
    plain = preprocessor.preprocess(_request(url))
    assert named.mm_items[0].mm_hash == plain.mm_items[0].mm_hash  # one identity, one cache entry
    assert plain.mm_items[0].processor_cache_hit


_CHILD = """
import json, sys
from services.gateway.frontend.prompt_wire import prompt_for_library
from services.preprocess.prompt import Prompt
from services.preprocess.preprocessor import Preprocessor
from services.models.registry import resolve_model
from tests.factories import image_data_url, make_image
p = Preprocessor(resolve_model("tiny"))
IMAGE_PART = {"type": "image_url", "image_url": {"url": image_data_url(make_image(120, 90, seed=7))}}
req = {"messages": [{"role": "user", "content": [IMAGE_PART]}]}
print(p.preprocess(prompt_for_library(req)).mm_items[0].mm_hash)
"""


def test_mm_hash_is_equal_across_processes(preprocessor, repo_root):
    url = image_data_url(make_image(120, 90, seed=7))
    here = preprocessor.preprocess(
        prompt_for_library({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]})
    )
    child = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True, cwd=repo_root)
    assert child.stdout.strip() == here.mm_items[0].mm_hash
