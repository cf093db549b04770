"""Video decoding with PyAV (FFmpeg's libraries, bundled in the wheel): what the container's
header says, the limits checked on it before any frame is decoded, and then only the frames the
family's sampler picks, as RGB.

Why PyAV (docs/architecture.md has the comparison): transformers' own ``load_video(backend="pyav")``
reads a clip the same way, so the oracle and Tessera see the same frame count, frame rate and RGB
pixels; it names what failed (no such codec, invalid data) as typed exceptions, and it decodes
packet by packet with the GIL released, so a pool of threads decodes clips side by side.

Metadata, as transformers' pyav reader takes it: the stream's frame count and average frame rate
from the header. A container whose header has no frame count (WebM, Matroska) gets one by
demuxing, which reads packets but decodes nothing. Decoding walks the stream in order up to the
last picked frame (inter-coded frames need their predecessors) and converts only picked frames.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import av
from PIL import Image

from services.preprocess.errors import InvalidVideoDataError, VideoTooLargeError

DECODER_NAME = f"pyav-{av.__version__}"  # part of a video's identity (shared/hashing.py)


@dataclass(frozen=True, slots=True)
class VideoLimits:
    max_duration_s: float
    max_frames: int  # frames the sampler may pick
    max_decoded_pixels: int  # picked frames x width x height


@dataclass(frozen=True, slots=True)
class VideoHeader:
    num_frames: int
    fps: float
    width: int
    height: int
    codec: str

    @property
    def duration_s(self) -> float:
        return self.num_frames / self.fps


def read_header(data: bytes, limits: VideoLimits) -> VideoHeader:
    """The clip's header, checked: a video stream, a decoder for its codec, frames, a frame rate
    and a duration within the limit. Raises InvalidVideoDataError or VideoTooLargeError."""
    with _open(data) as container:
        stream = _video_stream(container)
        rate = stream.average_rate
        if rate is None or float(rate) <= 0:
            raise InvalidVideoDataError("the video's frame rate is unknown or zero")
        num_frames = int(stream.frames) or _count_packets(container, stream)
        if num_frames <= 0:
            raise InvalidVideoDataError("the video has no frames")
        if not stream.width or not stream.height:
            raise InvalidVideoDataError("the video's frames have no size")
        header = VideoHeader(num_frames, float(rate), int(stream.width), int(stream.height), stream.codec_context.name)
    if header.duration_s > limits.max_duration_s:
        limit = f"the limit of {limits.max_duration_s:g} s (max_video_seconds)"
        raise VideoTooLargeError(f"the video lasts {header.duration_s:.1f} s, over {limit}")
    return header


def check_sampled(header: VideoHeader, num_sampled: int, limits: VideoLimits) -> None:
    """The sampler's pick against the frame and decoded-pixel limits, before decoding."""
    if num_sampled > limits.max_frames:
        raise VideoTooLargeError(f"the sampler picks {num_sampled} frames, over the limit of {limits.max_frames} (max_video_frames)")
    num_pixels = num_sampled * header.width * header.height
    if num_pixels > limits.max_decoded_pixels:
        raise VideoTooLargeError(
            f"{num_sampled} frames of {header.width}x{header.height} are {num_pixels} pixels, "
            f"over the limit of {limits.max_decoded_pixels} (max_video_decoded_pixels)"
        )


def decode_frames(data: bytes, indices: Sequence[int]) -> list[Image.Image]:
    """The frames at ``indices`` (ascending, repeats allowed) as RGB images, in order. A clip that
    ends or breaks before its last picked frame is truncated: InvalidVideoDataError."""
    wanted = sorted(set(int(i) for i in indices))
    picked: dict[int, Image.Image] = {}
    with _open(data) as container:
        stream = _video_stream(container)
        stream.thread_type = "AUTO"
        try:
            for number, frame in enumerate(container.decode(stream)):
                if number in wanted:
                    picked[number] = Image.fromarray(frame.to_ndarray(format="rgb24"))
                if number >= wanted[-1]:
                    break
        except av.error.FFmpegError as exc:
            raise InvalidVideoDataError(f"the video cannot be decoded past frame {len(picked)}: {exc}") from None
    missing = [i for i in wanted if i not in picked]
    if missing:
        raise InvalidVideoDataError(f"the video is truncated: frame {missing[0]} of the header's count cannot be decoded")
    return [picked[int(i)] for i in indices]


def _open(data: bytes):
    try:
        return av.open(io.BytesIO(data), mode="r", metadata_errors="ignore")
    except (av.error.FFmpegError, ValueError, UnicodeDecodeError) as exc:
        raise InvalidVideoDataError(f"the data is not a video container FFmpeg can read: {exc}") from None


def _video_stream(container):
    if not container.streams.video:
        raise InvalidVideoDataError("the file has no video stream")
    stream = container.streams.video[0]
    try:
        codec = stream.codec_context  # None where this FFmpeg build has no decoder for the codec
    except (av.error.FFmpegError, ValueError) as exc:
        raise InvalidVideoDataError(f"the video's codec is not supported: {exc}") from None
    if codec is None:
        raise InvalidVideoDataError("the video's codec is not supported by this server's decoder")
    return stream


def _count_packets(container, stream) -> int:
    try:
        count = sum(1 for packet in container.demux(stream) if packet.size)
    except av.error.FFmpegError as exc:
        raise InvalidVideoDataError(f"the video's packets cannot be read: {exc}") from None
    container.seek(0)
    return count
