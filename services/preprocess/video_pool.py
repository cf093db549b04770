"""The preprocess node's video decode pool: a bounded set of threads that fetch and decode a
request's clips before the request takes the node's one working thread (which tokenizes and
runs the processors). Decoding dominates a video request's preprocessing; on the working thread
it would hold every other request behind it, and on the serving loop it would stall the node.

The servicer awaits ``prepare`` on its loop (no thread of the loop's waits); each clip is one
pool task, so a request's clips decode side by side and at most ``num_threads`` decode at once
across requests. A clip whose groups are all in the processor cache is not decoded.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from services.models.video import VideoOptions
from services.preprocess.errors import PreprocessError
from services.preprocess.preprocessor import Preprocessor
from services.preprocess.prompt import Prompt, VideoInput
from services.preprocess.prompt_input import check_prompt
from services.preprocess.video_items import DecodedClip, VideoPipeline
from shared.types import MmHash


@dataclass(frozen=True, slots=True)
class PreparedMedia:
    fetched: dict[str, bytes]  # the clips' bytes read from a URL (data:, http(s), file), by URL: read once
    decoded: dict[MmHash, DecodedClip]  # by clip identity


class VideoDecodePool:
    def __init__(self, preprocessor: Preprocessor, num_threads: int) -> None:
        self._preprocessor = preprocessor
        self._executor = ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="video-decode")

    async def prepare(self, prompt: Prompt) -> PreparedMedia:
        config = self._preprocessor.config
        try:
            checked = check_prompt(prompt, max_images=config.max_images_per_request, max_videos=config.max_videos_per_request)
        except PreprocessError:
            return PreparedMedia({}, {})  # preprocessing reports it
        if not checked.videos:
            return PreparedMedia({}, {})
        pipeline = self._preprocessor.videos  # a family without video says so here
        loop = asyncio.get_running_loop()
        options = pipeline.settle(prompt.video_options)
        results = await asyncio.gather(*(loop.run_in_executor(self._executor, _prepare, pipeline, v, options) for v in checked.videos))
        fetched = {url: data for url, data, _, _ in results if url is not None and data is not None}
        decoded = {clip_hash: clip for _, _, clip_hash, clip in results if clip is not None}
        return PreparedMedia(fetched, decoded)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _prepare(
    pipeline: VideoPipeline, video: VideoInput, options: VideoOptions
) -> tuple[str | None, bytes | None, MmHash, DecodedClip | None]:
    """One clip on a pool thread: (its URL, its bytes if read, its identity, its frames unless its
    groups are all cached)."""
    clip_hash, data = pipeline.identify(video, options, {})
    if pipeline.is_known(clip_hash) or data is None:  # data None: a uuid alone (VideoPipeline.items answers it)
        return video.url, data, clip_hash, None
    return video.url, data, clip_hash, pipeline.decode(data, options)
