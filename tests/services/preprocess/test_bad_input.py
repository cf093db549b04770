"""Bad input: each case raises its typed error with a clear message; no crash, no hang, and the
preprocessor keeps serving good requests afterwards."""

from __future__ import annotations

import base64
import struct
import zlib

import pytest

from protos.gen import pb
from services.gateway.error_kinds import KIND_RULES
from services.gateway.frontend.prompt_wire import prompt_for_library
from services.preprocess import errors as E
from services.preprocess.config import PreprocessConfig
from services.preprocess.preprocessor import Preprocessor
from services.preprocess.prompt_wire import prompt_from_wire
from tests.factories import data_url, encode_image, image_data_url, make_image


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims width x height, with one tiny IDAT: a decompression-bomb header."""

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0")) + chunk(b"IEND", b"")


def _user(*parts):
    return {"messages": [{"role": "user", "content": list(parts)}]}


def _img(url):
    return {"type": "image_url", "image_url": {"url": url}}


GOOD_PNG = encode_image(make_image(64, 64, seed=1))

# (name, request body, expected error type, substring of the message)
BAD_CASES = [
    ("invalid_base64", _user(_img("data:image/png;base64,@@@not-base64@@@")), E.InvalidImageDataError, "not valid base64"),
    ("bad_base64_padding", _user({"type": "image", "image": "abc"}), E.InvalidImageDataError, "not valid base64"),
    ("non_image_bytes", _user(_img(data_url(b"hello, I am plain text, not a picture"))), E.InvalidImageDataError, "not a supported image"),
    (
        "non_image_mime",
        _user(_img("data:text/plain;base64," + base64.b64encode(GOOD_PNG).decode())),
        E.InvalidImageDataError,
        "expected image/*",
    ),
    ("truncated_png", _user(_img(data_url(GOOD_PNG[: len(GOOD_PNG) // 2]))), E.InvalidImageDataError, "corrupt or truncated"),
    ("zero_by_zero", _user(_img(data_url(_png_header_only(0, 0)))), E.InvalidImageDimensionsError, "zero size (0x0)"),
    ("corrupt_png_header", _user(_img(data_url(GOOD_PNG[:8] + b"garbage" * 20))), E.InvalidImageDataError, "could not be parsed"),
    ("header_bomb_60000", _user(_img(data_url(_png_header_only(60000, 60000)))), E.ImageTooLargeError, "3600000000 pixels"),
    ("over_pixel_limit", _user(_img(image_data_url(make_image(3000, 2000)))), E.ImageTooLargeError, "over the limit"),
    ("extreme_aspect_ratio", _user(_img(image_data_url(make_image(2010, 10)))), E.InvalidImageDimensionsError, "aspect ratio"),
    ("too_many_images", _user(*[_img(image_data_url(make_image(32, 32))) for _ in range(5)]), E.TooManyImagesError, "at most 4"),
    ("http_url_private", _user(_img("http://127.0.0.1:9/cat.png")), E.ImageSourceNotAllowedError, "non-public address"),
    ("local_path_disabled", _user(_img("/etc/passwd")), E.ImageSourceNotAllowedError, "local image paths are disabled"),
    (
        "image_in_assistant_turn",
        {"messages": [{"role": "assistant", "content": [_img(image_data_url(make_image(32, 32)))]}]},
        E.InvalidRequestError,
        "only allowed in user messages",
    ),
    (
        "placeholder_count_mismatch",
        {"prompt": "<|vision_start|><|image_pad|><|vision_end|> two? <|image_pad|>", "images": [image_data_url(make_image(32, 32))]},
        E.PlaceholderMismatchError,
        "2 image placeholder(s) but 1 image(s)",
    ),
    (
        "images_without_placeholder",
        {"prompt_token_ids": [1, 2, 3], "images": [image_data_url(make_image(32, 32))]},
        E.PlaceholderMismatchError,
        "0 image placeholder(s)",
    ),
    ("token_id_out_of_vocab", {"prompt_token_ids": [1, 2**31 - 1]}, E.InvalidRequestError, "outside the vocabulary"),
    ("prompt_too_long", {"prompt": "word " * 600}, E.PromptTooLongError, "limit is 512"),
    ("oversized_encoded_image", _user(_img(data_url(b"\0" * (3 * 1024 * 1024)))), E.ImageTooLargeError, "bytes, over the limit"),
]
_IMAGE = pb.ImageInput(url=data_url(GOOD_PNG))
_USER = pb.ChatMessage.USER
# What a typed client can still get wrong (the gateway's models refuse these at the HTTP edge).
TYPED_CASES = [
    ("no_prompt", pb.PromptInput(), "the prompt is empty"),
    ("empty_messages", pb.PromptInput(chat=pb.ChatPrompt()), "must not be empty"),
    ("no_role", pb.PromptInput(chat=pb.ChatPrompt(messages=[pb.ChatMessage(text="hi")])), "role must be one of"),
    ("user_without_content", pb.PromptInput(chat=pb.ChatPrompt(messages=[pb.ChatMessage(role=_USER)])), "needs content"),
    (
        "tool_calls_on_a_user_turn",
        pb.PromptInput(chat=pb.ChatPrompt(messages=[pb.ChatMessage(role=_USER, text="hi", tool_calls=[pb.ToolCall(id="1", name="f")])])),
        "only assistant messages carry tool_calls",
    ),
    (
        "empty_part",
        pb.PromptInput(chat=pb.ChatPrompt(messages=[pb.ChatMessage(role=_USER, parts=pb.ContentParts(parts=[pb.ContentPart()]))])),
        "is empty",
    ),
    (
        "chat_images_beside_the_messages",
        pb.PromptInput(chat=pb.ChatPrompt(messages=[pb.ChatMessage(role=_USER, text="hi")]), images=[_IMAGE]),
        "go in its messages",
    ),
    ("image_without_source", pb.PromptInput(text="x", images=[pb.ImageInput()]), "has no source"),
    ("empty_uuid", pb.PromptInput(text="x", images=[pb.ImageInput(url=_IMAGE.url, uuid="")]), "uuid"),
    ("long_uuid", pb.PromptInput(text="x", images=[pb.ImageInput(url=_IMAGE.url, uuid="u" * 257)]), "uuid"),
    (
        "template_kwargs_not_an_object",
        pb.PromptInput(chat=pb.ChatPrompt(messages=[pb.ChatMessage(role=_USER, text="hi")], chat_template_kwargs_json="[1]")),
        "must be a JSON object",
    ),
    (
        "template_kwargs_set_messages",
        pb.PromptInput(chat=pb.ChatPrompt(messages=[pb.ChatMessage(role=_USER, text="hi")], chat_template_kwargs_json='{"messages": []}')),
        "may not set messages",
    ),
]


@pytest.fixture(scope="module")
def strict_preprocessor(tiny_model):
    config = PreprocessConfig(max_image_bytes=2 * 1024 * 1024, max_image_pixels=4_000_000, max_images_per_request=4, max_prompt_tokens=512)
    return Preprocessor(tiny_model, config)


@pytest.mark.parametrize("name,body,error_type,message", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_input_raises_typed_error(name, body, error_type, message, strict_preprocessor):
    with pytest.raises(error_type) as info:
        strict_preprocessor.preprocess(prompt_for_library(body))
    assert message in info.value.message
    assert 400 <= KIND_RULES[info.value.kind].status < 500  # the client's error, as the gateway answers it
    # The preprocessor is unharmed: a good request still succeeds.
    result = strict_preprocessor.preprocess(prompt_for_library(_user(_img(data_url(GOOD_PNG)), {"type": "text", "text": "ok"})))
    assert len(result.mm_items) == 1


@pytest.mark.parametrize("name,prompt,message", TYPED_CASES, ids=[c[0] for c in TYPED_CASES])
def test_a_malformed_prompt_input_is_an_invalid_request(name, prompt, message, strict_preprocessor):
    with pytest.raises(E.InvalidRequestError) as info:
        strict_preprocessor.preprocess(prompt_from_wire(prompt))  # as the servicer takes it off the wire
    assert message in info.value.message


def test_image_bytes_are_taken_as_they_are_and_their_size_is_checked(strict_preprocessor):
    marker = "<|vision_start|><|image_pad|><|vision_end|>"
    as_url = strict_preprocessor.preprocess(prompt_from_wire(pb.PromptInput(text=marker, images=[_IMAGE])))
    as_bytes = strict_preprocessor.preprocess(prompt_from_wire(pb.PromptInput(text=marker, images=[pb.ImageInput(data=GOOD_PNG)])))
    assert as_bytes.mm_items[0].mm_hash == as_url.mm_items[0].mm_hash
    with pytest.raises(E.ImageTooLargeError, match="over the limit"):
        strict_preprocessor.preprocess(prompt_from_wire(pb.PromptInput(text="x", images=[pb.ImageInput(data=b"\0" * (3 * 1024 * 1024))])))


def test_remote_urls_turned_off_are_refused(tiny_model):
    preprocessor = Preprocessor(tiny_model, PreprocessConfig(allow_remote_images=False))
    with pytest.raises(E.ImageSourceNotAllowedError, match="remote image URLs are disabled"):
        preprocessor.preprocess(prompt_for_library(_user(_img("https://images.example.org/x.png"))))


def test_remote_url_off_allow_list_is_refused(tiny_model):
    config = PreprocessConfig(allow_remote_images=True, allowed_image_domains=("images.example.org",))
    preprocessor = Preprocessor(tiny_model, config)
    with pytest.raises(E.ImageSourceNotAllowedError, match="not on the allowed domain list"):
        preprocessor.preprocess(prompt_for_library(_user(_img("https://evil.example.com/x.png"))))


def test_local_path_outside_media_dir_is_refused(tiny_model, tmp_path):
    media = tmp_path / "media"
    media.mkdir()
    (media / "ok.png").write_bytes(GOOD_PNG)
    (tmp_path / "secret.png").write_bytes(GOOD_PNG)
    preprocessor = Preprocessor(tiny_model, PreprocessConfig(local_media_dir=media))
    assert len(preprocessor.preprocess(prompt_for_library(_user(_img(str(media / "ok.png"))))).mm_items) == 1
    assert len(preprocessor.preprocess(prompt_for_library(_user(_img(f"file://{media / 'ok.png'}")))).mm_items) == 1
    for escape in (str(tmp_path / "secret.png"), str(media / ".." / "secret.png"), f"file://{tmp_path}/secret.png"):
        with pytest.raises(E.ImageSourceNotAllowedError, match="outside the allowed media directory"):
            preprocessor.preprocess(prompt_for_library(_user(_img(escape))))
    with pytest.raises(E.ImageFetchError, match="could not read"):
        preprocessor.preprocess(prompt_for_library(_user(_img(str(media / "missing.png")))))
