"""Our token ids, placeholder ranges, pixels and M-RoPE positions equal transformers' own
processor and model code, for chat, text and pre-tokenized prompts."""

from __future__ import annotations

import pytest
import torch

from services.gateway.frontend.prompt_wire import prompt_for_library
from services.models.builtins.qwen2_tokens import IMAGE_PAD_ID
from services.preprocess.preprocessor import Preprocessor
from shared.types import PlaceholderRange
from tests.factories import chat_case, encode_image, make_image


@pytest.fixture(scope="module")
def preprocessor(tiny_model):
    return Preprocessor(tiny_model)


def _png(w, h, seed=0, mode="RGB"):
    return encode_image(make_image(w, h, seed=seed, mode=mode), "PNG")


def _runs(token_ids: list[int], token: int) -> list[PlaceholderRange]:
    ranges, i = [], 0
    while i < len(token_ids):
        if token_ids[i] == token:
            j = i
            while j < len(token_ids) and token_ids[j] == token:
                j += 1
            ranges.append(PlaceholderRange(i, j - i))
            i = j
        else:
            i += 1
    return ranges


CASES = {
    "text_only": lambda: chat_case("Describe the weather in one sentence."),
    "one_image": lambda: chat_case(_png(448, 448, 1), "What is in this image?"),
    "three_images": lambda: chat_case(_png(64, 64, 2), "first", _png(120, 80, 3), "second", _png(300, 200, 4), "compare"),
    "image_at_start": lambda: chat_case(_png(96, 96, 5), "caption this"),
    "image_in_middle": lambda: chat_case("Look at", _png(96, 96, 6), "and describe it"),
    "image_at_end": lambda: chat_case("Here is a picture:", _png(96, 96, 7)),
    "tiny_28x28": lambda: chat_case(_png(28, 28, 8), "tiny"),
    "odd_size_nonsquare": lambda: chat_case(_png(517, 333, 9), "odd"),
    "tall_narrow": lambda: chat_case(_png(30, 900, 10), "tall"),
    "large_1024x768": lambda: chat_case(_png(1024, 768, 11), "big"),
    "largest_2048x1536": lambda: chat_case(_png(2048, 1536, 12), "huge"),
    "rgba_png": lambda: chat_case(_png(200, 150, 13, mode="RGBA"), "alpha"),
    "palette_png": lambda: chat_case(_png(160, 120, 14, mode="P"), "palette"),
    "grayscale_png": lambda: chat_case(_png(140, 90, 15, mode="L"), "gray"),
    "jpeg": lambda: chat_case((encode_image(make_image(320, 240, seed=16), "JPEG", quality=90), "image/jpeg"), "photo"),
    "webp": lambda: chat_case((encode_image(make_image(200, 200, seed=17), "WEBP", lossless=True), "image/webp"), "web"),
    "gif_first_frame": lambda: chat_case((_gif(), "image/gif"), "animated"),
}


def _gif() -> bytes:
    frames = [make_image(100, 80, seed=s, mode="P") for s in (18, 19)]
    import io

    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=100)
    return buf.getvalue()


def _assert_same(ours, oracle, oracle_inputs):
    expected_ids = oracle_inputs.token_ids
    assert ours.prompt_token_ids == expected_ids
    assert [item.placeholder for item in ours.mm_items] == _runs(expected_ids, IMAGE_PAD_ID)
    if ours.mm_items:
        grids = [list(item.image.grid_thw) for item in ours.mm_items]
        assert grids == oracle_inputs.image_grid_thw.tolist()
        assert torch.equal(torch.cat([item.image.pixel_values for item in ours.mm_items]), oracle_inputs.pixel_values)
    positions, delta = oracle.rope_index(oracle_inputs)
    assert torch.equal(ours.mrope_positions, positions)
    assert ours.mrope_delta == delta


@pytest.mark.parametrize("name", sorted(CASES))
def test_chat_prompt_matches_transformers(name, preprocessor, oracle):
    case = CASES[name]()
    oracle_inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images)
    _assert_same(preprocessor.preprocess(case.prompt), oracle, oracle_inputs)


@pytest.mark.parametrize("name", ["one_image", "three_images", "image_in_middle", "rgba_png", "text_only"])
def test_pretokenized_prompt_matches_transformers(name, preprocessor, oracle):
    case = CASES[name]()
    text = oracle.chat_text(case.oracle_messages)
    token_ids = oracle.tokenizer.encode(text, add_special_tokens=False)
    urls = [part["image_url"]["url"] for part in case.body["messages"][0]["content"] if part["type"] == "image_url"]
    ours = preprocessor.preprocess(prompt_for_library({"prompt_token_ids": token_ids, "images": urls}))
    _assert_same(ours, oracle, oracle.process(text, case.images))


def test_text_prompt_matches_transformers(preprocessor, oracle):
    case = CASES["three_images"]()
    text = oracle.chat_text(case.oracle_messages)
    urls = [part["image_url"]["url"] for part in case.body["messages"][0]["content"] if part["type"] == "image_url"]
    ours = preprocessor.preprocess(prompt_for_library({"prompt": text, "images": urls}))
    _assert_same(ours, oracle, oracle.process(text, case.images))


def test_multi_turn_chat_matches_transformers(preprocessor, oracle):
    first = chat_case(_png(64, 96, 20), "What is this?")
    body = {
        "messages": first.body["messages"]
        + [
            {"role": "assistant", "content": "A gradient."},
            {"role": "user", "content": [{"type": "text", "text": "And this one?"}, {"type": "image", "image": _b64(_png(80, 64, 21))}]},
        ]
    }
    oracle_messages = first.oracle_messages + [
        {"role": "assistant", "content": "A gradient."},
        {"role": "user", "content": [{"type": "text", "text": "And this one?"}, {"type": "image"}]},
    ]
    from tests.factories import decoded

    images = first.images + [decoded(_png(80, 64, 21))]
    _assert_same(preprocessor.preprocess(prompt_for_library(body)), oracle, oracle.process(oracle.chat_text(oracle_messages), images))


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()
