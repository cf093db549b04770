"""The preprocess node decodes a request's clips on its decode pool, before the request takes
the node's working thread; a clip whose groups are cached is not decoded again."""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.preprocess.config import PreprocessConfig
from services.preprocess.errors import InvalidVideoDataError
from services.preprocess.node import PreprocessNode
from services.preprocess.video_items import VideoPipeline
from tests.factories import Video, chat_case, make_clip


@pytest.fixture()
def node(tiny_model):
    node = PreprocessNode(tiny_model, PreprocessConfig(video_decode_threads=2))
    yield node
    node.close()


def test_clips_decode_on_the_pool_not_on_the_working_thread(node, monkeypatch):
    threads: list[str] = []
    decode = VideoPipeline.decode

    def recording(self, data, options):
        threads.append(threading.current_thread().name)
        return decode(self, data, options)

    monkeypatch.setattr(VideoPipeline, "decode", recording)
    case = chat_case(Video(make_clip(8, fps=4, seed=1)), "and", Video(make_clip(6, fps=2, seed=2)), "?")
    media = asyncio.run(node.prepare_media(case.prompt))
    assert len(media.decoded) == 2 and all(name.startswith("video-decode") for name in threads)
    result = node.preprocess(case.prompt, media=media)
    assert len(threads) == 2  # nothing decoded again on the working thread
    assert len(result.mm_items) == 2 + 3  # 8 frames at 4 fps -> 4 sampled, 2 groups; 6 at 2 fps -> all 6, 3 groups
    again = asyncio.run(node.prepare_media(case.prompt))
    assert again.decoded == {} and len(threads) == 2  # every group cached: nothing to decode


def test_a_bad_clip_fails_its_request_from_the_pool(node):
    case = chat_case(Video(b"not a video at all"), "?")
    with pytest.raises(InvalidVideoDataError):
        asyncio.run(node.prepare_media(case.prompt))
