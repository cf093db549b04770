"""A request's videos, from bytes to temporal groups (services/models/video.py), with each group
cached on its own.

  identify: the clip's identity (shared.hashing.mm_hash_of_video: the bytes' digest, the
            sampler and processor settings, the decoder); a client uuid stands for the digest
            it is bound to (media_uuids.py), never for the clip itself
  recall:   a clip seen before names its groups (the clip memo); when the processor cache still
            holds every one, nothing is decoded or processed
  decode:   header -> limits -> the family's sampler -> limits -> the picked frames
            (services/preprocess/video_decode.py); thread-safe, so a node runs it on its pool
            of decode threads, off the thread that tokenizes and processes (``DecodedClip``)
  process:  the family's video processor; each group is hashed by its processed pixels and its
            placement (mm_hash_of_pixels) and cached, so a clip that shares groups with an
            earlier one shares their cache entries, encoder runs and prefix KV
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

import blake3
from PIL import Image

from services.models.video import ProcessedVideo, SampledClip, VideoMetadata, VideoOptions, VideoProcessingError, VideoProcessor
from services.preprocess.config import PreprocessConfig
from services.preprocess.errors import InvalidVideoDataError, MediaUuidUnboundError
from services.preprocess.media_sources import VIDEO, load_media
from services.preprocess.media_uuids import MediaUuids, has_source
from services.preprocess.processor_cache import BoundedMemo, ProcessorCache
from services.preprocess.prompt import VideoInput
from services.preprocess.video_decode import DECODER_NAME, VideoLimits, check_sampled, decode_frames, read_header
from shared.hashing import mm_hash_of_pixels, mm_hash_of_video
from shared.index.uuid_bindings import ContentBinding
from shared.types import MmHash


@dataclass(frozen=True, slots=True)
class DecodedClip:
    """A clip's sampled frames, decoded ahead of processing (by a node's decode pool)."""

    frames: tuple[Image.Image, ...]
    clip: SampledClip


@dataclass(frozen=True, slots=True)
class ClipRecord:
    """What the clip memo keeps of a processed clip: its groups' identities and layout."""

    group_hashes: tuple[MmHash, ...]
    video: ProcessedVideo  # its groups without pixels (the processor cache holds those)


@dataclass(frozen=True, slots=True)
class VideoItems:
    """One clip ready for the prompt: its groups (with pixels) and their mm_hashes."""

    video: ProcessedVideo
    group_hashes: tuple[MmHash, ...]
    processor_cache_hit: bool


class VideoPipeline:
    def __init__(
        self, processor: VideoProcessor, model_id: str, config: PreprocessConfig, cache: ProcessorCache, uuids: MediaUuids
    ) -> None:
        self.processor = processor
        self.uuids = uuids
        self.model_id = model_id
        self.config = config
        self.cache = cache
        self.limits = VideoLimits(config.max_video_seconds, config.max_video_frames, config.max_video_decoded_pixels)
        self.defaults = config.video_defaults()
        self._clip_to_record: BoundedMemo[MmHash, ClipRecord] = BoundedMemo(config.file_hash_memo_entries)
        # Decodes run on a node's pool threads: these two are added to under a lock.
        self.num_decoded = 0
        self.decode_seconds = 0.0
        self._count_lock = threading.Lock()

    def settle(self, requested: VideoOptions) -> VideoOptions:
        """A request's settings over the deployment's (``mm_processor_kwargs``)."""
        return requested.over(self.defaults)

    def identify(self, video: VideoInput, options: VideoOptions, fetched: Mapping[str, bytes]) -> tuple[MmHash, bytes | None]:
        """(the clip's identity, its bytes when they were read to name it)."""
        kwargs = self.processor.kwargs_for_hash(options)
        if video.uuid is not None and not has_source(video):
            digest, data = self.uuids.known(video.uuid, "video").digest, None
        else:
            data = self.read(video, fetched)
            digest = blake3.blake3(data).hexdigest()
            if video.uuid is not None:  # one call: binds a free uuid, raises the conflict of a bound one
                self.uuids.bind(video.uuid, ContentBinding(digest, len(data)), "video")
        content = {"kind": "file", "digest": digest}
        return mm_hash_of_video(model_id=self.model_id, content=content, processor_kwargs=kwargs, decoder=DECODER_NAME), data

    def is_known(self, clip_hash: MmHash) -> bool:
        """Whether the clip's groups are all cached: nothing to decode. A hint across threads
        (read without reordering the memo); ``items`` decides."""
        record = self._clip_to_record.peek(clip_hash)
        return record is not None and all(h in self.cache for h in record.group_hashes)

    def decode(self, data: bytes, options: VideoOptions) -> DecodedClip:
        """Header, limits, sampler, limits, frames. Touches no shared state but its counts."""
        started = time.perf_counter()
        header = read_header(data, self.limits)
        metadata = VideoMetadata(header.num_frames, header.fps, header.width, header.height)
        clip = self._sample(metadata, options)
        check_sampled(header, len(set(clip.indices)), self.limits)
        decoded = DecodedClip(tuple(decode_frames(data, clip.indices)), clip)
        with self._count_lock:
            self.num_decoded += 1
            self.decode_seconds += time.perf_counter() - started
        return decoded

    def items(
        self,
        video: VideoInput,
        options: VideoOptions,
        fetched: Mapping[str, bytes],
        decoded: Mapping[MmHash, DecodedClip],
    ) -> VideoItems:
        clip_hash, data = self.identify(video, options, fetched)
        cached = self._recall(clip_hash)
        if cached is not None:
            return cached
        clip = decoded.get(clip_hash)
        if clip is None:
            if data is None:  # a uuid alone, whose groups are no longer all cached here
                raise MediaUuidUnboundError(f"video uuid {video.uuid!r} names a clip no longer cached here: send the video again")
            clip = self.decode(data, options)
        try:
            processed = self.processor.process(clip.frames, clip.clip, options)
        except VideoProcessingError as exc:
            raise InvalidVideoDataError(str(exc)) from None
        hashes = tuple(self._group_hash(processed, k) for k in range(len(processed.groups)))
        for group_hash, group in zip(hashes, processed.groups):
            if self.cache.get(group_hash) is None:  # a hit: a group an earlier clip shares (counted as one)
                self.cache.put(group_hash, group)
        bare = ProcessedVideo(tuple(g.without_pixels() for g in processed.groups), processed.placements, processed.timestamps)
        self._clip_to_record.put(clip_hash, ClipRecord(hashes, bare))
        return VideoItems(processed, hashes, processor_cache_hit=False)

    def _recall(self, clip_hash: MmHash) -> VideoItems | None:
        record = self._clip_to_record.get(clip_hash)
        if record is None:
            return None
        groups = [self.cache.get(h) for h in record.group_hashes]
        if any(g is None for g in groups):
            return None
        video = ProcessedVideo(tuple(groups), record.video.placements, record.video.timestamps)
        return VideoItems(video, record.group_hashes, processor_cache_hit=True)

    def _sample(self, metadata: VideoMetadata, options: VideoOptions) -> SampledClip:
        try:
            return self.processor.sample(metadata, options)
        except VideoProcessingError as exc:
            raise InvalidVideoDataError(str(exc)) from None

    def read(self, video: VideoInput, fetched: Mapping[str, bytes]) -> bytes:
        """The clip's encoded bytes (checked against max_video_bytes)."""
        data = fetched.get(video.url) if video.url is not None else None
        return data if data is not None else load_media(video, self.config, VIDEO)

    def _group_hash(self, video: ProcessedVideo, index: int) -> MmHash:
        group, placement = video.groups[index], video.placements[index]
        assert group.pixel_values is not None
        pixels = group.pixel_values.contiguous()
        place = None if placement is None else {"opens_clip": placement.index == 0, "time_position": placement.time_position}
        return mm_hash_of_pixels(
            model_id=self.model_id,
            modality="video_group",
            mode=str(pixels.dtype),
            size=(group.grid_thw[1], group.grid_thw[2]),
            pixel_bytes=pixels.view(-1).numpy().tobytes(),
            processor_kwargs={"placement": place},
        )
