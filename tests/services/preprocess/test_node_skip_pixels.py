"""Skipping the image processor for images the index says an encoder holds (in-process index)."""

from __future__ import annotations

import pytest

from services.preprocess.config import PreprocessConfig
from services.preprocess.node import PreprocessNode
from services.transport.tensor_channel import TensorInbox
from shared.index.backend import create_index
from shared.index.types import IndexEvents, MmEntry, NodeInfo
from tests.factories import chat_case, encode_image, make_image


@pytest.fixture()
def index():
    made = create_index("memory://", namespace="skip-test")
    yield made
    made.close()


@pytest.fixture()
def node(tiny_model, index):
    made = PreprocessNode(tiny_model, PreprocessConfig(), index=index)
    yield made
    made.close()


def _publish(index, mm_hash: str, grid: tuple[int, int, int]) -> None:
    info = NodeInfo("encoder@127.0.0.1:1", "encoder", "127.0.0.1:1")
    epoch = index.register_node(info, ttl_s=60)
    index.publish(info.node_id, epoch, IndexEvents(mm_stored={mm_hash: MmEntry(grid[0] * grid[1] * grid[2] // 4, grid, 1000)}))


def test_indexed_image_is_not_processed_and_matches_a_processed_one(tiny_model, index, node):
    prompt = chat_case(encode_image(make_image(140, 112, seed=3)), "What is this?").prompt
    reference = PreprocessNode(tiny_model, PreprocessConfig())
    expected = reference.preprocess(prompt)
    reference.close()
    _publish(index, expected.mm_items[0].mm_hash, expected.mm_items[0].image.grid_thw)

    result = node.preprocess(prompt, skip_indexed=True)
    item = result.mm_items[0]
    assert item.image.pixel_values is None
    assert result.prompt_token_ids == expected.prompt_token_ids
    assert item.placeholder == expected.mm_items[0].placeholder
    assert result.mrope_delta == expected.mrope_delta
    assert node.metrics.num_images_skipped.value == 1

    # Pixels it never made cannot be pushed; preprocessing again without skipping makes them.
    inbox = TensorInbox("tcp://127.0.0.1:0")
    try:
        not_found, _ = node.push_pixels([item.mm_hash], target_id="e", target_address=inbox.address)
        assert not_found == [item.mm_hash]
        again = node.preprocess(prompt, skip_indexed=False)
        assert again.mm_items[0].image.pixel_values is not None
        not_found, transfer = node.push_pixels([item.mm_hash], target_id="e", target_address=inbox.address)
        assert not_found == [] and transfer.num_bytes_sent > 0
        assert inbox.wait(item.mm_hash, 10) is not None
    finally:
        inbox.close()


def test_unindexed_or_unskipped_images_are_processed(index, node):
    prompt = chat_case(encode_image(make_image(84, 84, seed=4)), "Describe.").prompt
    result = node.preprocess(prompt, skip_indexed=True)
    assert result.mm_items[0].image.pixel_values is not None  # the index knows nothing of it
    assert node.metrics.num_images_skipped.value == 0
