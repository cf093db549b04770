"""Video decoding: the header and frames as transformers' own pyav reader gives them, the limits
checked before decoding, and a typed error for each kind of bad clip."""

from __future__ import annotations

import io
import tempfile

import av
import numpy as np
import pytest

from services.preprocess.errors import InvalidVideoDataError, VideoTooLargeError
from services.preprocess.video_decode import VideoLimits, check_sampled, decode_frames, read_header
from tests.factories import encode_image, make_clip, make_clip_of_unknown_codec, make_clip_without_frame_rate, make_image

LIMITS = VideoLimits(max_duration_s=3600, max_frames=768, max_decoded_pixels=10**10)


def _transformers_read(data: bytes, indices: list[int]):
    from transformers.video_utils import load_video

    with tempfile.NamedTemporaryFile(suffix=".mp4") as f:
        f.write(data)
        f.flush()
        return load_video(f.name, backend="pyav", sample_indices_fn=lambda metadata, **_: np.array(indices))


@pytest.mark.parametrize("codec,container", [("libx264", "mp4"), ("libvpx-vp9", "webm")])
def test_header_and_frames_are_transformers_pyav_readers(codec, container):
    data = make_clip(24, fps=8, width=40, height=30, codec=codec, container=container, seed=3)
    header = read_header(data, LIMITS)
    indices = [0, 5, 11, 23]
    frames, metadata = _transformers_read(data, indices)
    if container == "mp4":  # WebM's header has no frame count: transformers reads 0, we count packets
        assert (header.num_frames, header.fps) == (metadata.total_num_frames, metadata.fps)
    assert (header.num_frames, header.fps, header.width, header.height) == (24, 8.0, 40, 30)
    ours = decode_frames(data, indices)
    assert len(ours) == len(frames) == len(indices)
    assert all(np.array_equal(np.asarray(a), b) for a, b in zip(ours, frames))


def test_repeated_indices_give_repeated_frames():
    data = make_clip(6, fps=6)
    frames = decode_frames(data, [0, 0, 5])
    assert np.array_equal(np.asarray(frames[0]), np.asarray(frames[1]))
    assert not np.array_equal(np.asarray(frames[0]), np.asarray(frames[2]))


def _faststart_clip(tmp_path) -> bytes:
    path = tmp_path / "faststart.mp4"  # faststart rewrites the file: it needs a real one
    with av.open(str(path), "w", format="mp4", options={"movflags": "faststart"}) as out:
        stream = out.add_stream("libx264", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(30):
            out.mux(stream.encode(av.VideoFrame.from_ndarray(np.asarray(make_image(64, 48, seed=i)), format="rgb24")))
        out.mux(stream.encode())
    return path.read_bytes()


def test_truncated_file_whose_header_promises_more_frames_is_refused(tmp_path):
    data = _faststart_clip(tmp_path)
    cut = data[: len(data) * 2 // 3]
    header = read_header(cut, LIMITS)
    assert header.num_frames == 30
    with pytest.raises(InvalidVideoDataError, match="truncated|cannot be decoded"):
        decode_frames(cut, [0, 29])


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"\x00" * 100, id="zeros"),
        pytest.param(bytes(np.random.default_rng(0).integers(0, 255, 5000, dtype=np.uint8)), id="random"),
        pytest.param(make_clip(30)[:3000], id="truncated_mp4"),
        pytest.param(b"", id="empty"),
    ],
)
def test_data_that_is_not_a_video_is_a_400(data):
    with pytest.raises(InvalidVideoDataError):
        read_header(data, LIMITS)


def test_a_container_without_frames_is_a_400():
    buf = io.BytesIO()
    with av.open(buf, "w", format="matroska") as out:
        stream = out.add_stream("libx264", rate=10)
        stream.width, stream.height = 64, 48
    with pytest.raises(InvalidVideoDataError):
        read_header(buf.getvalue(), LIMITS)


def test_a_still_image_reads_as_one_frame():
    header = read_header(encode_image(make_image(32, 32)), LIMITS)
    assert header.num_frames == 1  # the family's sampler then refuses it: too few frames


def test_limits_name_themselves_before_any_frame_is_decoded():
    data = make_clip(30, fps=10)
    with pytest.raises(VideoTooLargeError, match="max_video_seconds"):
        read_header(data, VideoLimits(max_duration_s=2.5, max_frames=768, max_decoded_pixels=10**10))
    header = read_header(data, LIMITS)
    with pytest.raises(VideoTooLargeError, match="max_video_frames"):
        check_sampled(header, 9, VideoLimits(3600, max_frames=8, max_decoded_pixels=10**10))
    with pytest.raises(VideoTooLargeError, match="max_video_decoded_pixels"):
        check_sampled(header, 8, VideoLimits(3600, 768, max_decoded_pixels=8 * 64 * 48 - 1))
    check_sampled(header, 8, VideoLimits(3600, 8, max_decoded_pixels=8 * 64 * 48))


def test_a_video_without_a_frame_rate_is_a_400():
    data = make_clip_without_frame_rate()
    with av.open(io.BytesIO(data)) as container:  # the file itself: frames, but no rate
        stream = container.streams.video[0]
        assert stream.average_rate is None
        assert sum(1 for packet in container.demux(stream) if packet.size) == 6
    with pytest.raises(InvalidVideoDataError, match="frame rate is unknown or zero"):
        read_header(data, LIMITS)


def _evc_mp4() -> bytes:
    """The sample entry's fourcc set to 'evc1': FFmpeg knows the codec (MPEG-5 EVC) but decodes it
    only through libxevd, which PyAV's wheel does not bundle."""
    if "libxevd" in av.codecs_available:
        pytest.skip("this PyAV build decodes EVC")
    data = make_clip(6, fps=6, width=32, height=32)
    entry = data.index(b"avc1", data.index(b"stsd"))  # after stsd: not the ftyp brand
    return data[:entry] + b"evc1" + data[entry + 4 :]


@pytest.mark.parametrize("make", [make_clip_of_unknown_codec, _evc_mp4], ids=["codec_unknown_to_ffmpeg", "codec_without_decoder"])
def test_a_codec_this_build_cannot_decode_is_a_400(make):
    data = make()
    with av.open(io.BytesIO(data)) as container:  # the stream is there, with a rate; only the decoder is missing
        stream = container.streams.video[0]
        assert stream.codec_context is None and stream.average_rate == 6
    with pytest.raises(InvalidVideoDataError, match="codec is not supported"):
        read_header(data, LIMITS)
    with pytest.raises(InvalidVideoDataError, match="codec is not supported"):
        decode_frames(data, [0])
