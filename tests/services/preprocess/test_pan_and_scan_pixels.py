"""Pan-and-Scan on the preprocess node: each crop is an item of its own (its own mm_hash and
span), a push of a crop's hash finds that crop's pixels through its image in the processor cache,
and turning Pan-and-Scan on changes every image's mm_hash."""

from __future__ import annotations

import pytest
import torch

from services.models.registry import resolve_model
from services.preprocess.config import PreprocessConfig
from services.preprocess.node import PreprocessNode
from services.transport.tensor_channel import TensorInbox
from tests.factories import chat_case, encode_image, make_image


@pytest.fixture(scope="module")
def gemma3_tiny():
    return resolve_model("gemma3-tiny", progress=lambda _m: None)


def _wide_prompt():
    return chat_case(encode_image(make_image(900, 300, seed=1)), "What is this?").prompt


def test_each_crop_is_pushed_with_its_own_pixels(gemma3_tiny):
    node = PreprocessNode(gemma3_tiny, PreprocessConfig(pan_and_scan=True))
    inbox = TensorInbox("tcp://127.0.0.1:0")
    try:
        items = node.preprocess(_wide_prompt()).mm_items
        assert len(items) > 1 and len({item.mm_hash for item in items}) == len(items)
        not_found, transfer = node.push_pixels([item.mm_hash for item in items], target_id="e", target_address=inbox.address)
        assert not_found == [] and transfer.num_bytes_sent == sum(item.image.num_bytes for item in items)
        for item in items:
            message = inbox.wait(item.mm_hash, 10)
            assert message is not None and message.meta["grid_thw"] == list(item.image.grid_thw)
            torch.testing.assert_close(message.tensors["pixel_values"], item.image.pixel_values, rtol=0, atol=0)
    finally:
        inbox.close()
        node.close()


def test_pan_and_scan_on_and_off_are_different_images(gemma3_tiny):
    off = PreprocessNode(gemma3_tiny, PreprocessConfig(pan_and_scan=False))
    on = PreprocessNode(gemma3_tiny, PreprocessConfig(pan_and_scan=True))
    small = chat_case(encode_image(make_image(64, 64, seed=2)), "And this?").prompt  # too small to crop
    try:
        for prompt in (_wide_prompt(), small):
            hashes_off = {item.mm_hash for item in off.preprocess(prompt).mm_items}
            hashes_on = {item.mm_hash for item in on.preprocess(prompt).mm_items}
            assert not hashes_off & hashes_on
    finally:
        off.close()
        on.close()
