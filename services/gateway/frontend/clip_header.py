"""A clip's frame count, frame rate and frame size from its MP4 / QuickTime header, read without
decoding anything: what the media budget prices a clip by (media_budget.py).

ISO base media files keep these in the ``moov`` box: per track, ``tkhd`` (the frame size, 16.16
fixed point), ``mdia/hdlr`` (``vide`` for the video track), ``mdia/mdhd`` (its timescale and
duration) and ``mdia/minf/stbl/stsz`` (its number of samples: frames). Other containers (WebM,
Matroska, AVI) and malformed files give None; the budget then prices a typical clip. So does a
header that states no usable clip (no frames, no duration, a zero side): every read here is
bounds-checked, so no bytes make it raise, and the preprocess node, which decodes the clip, owns
the 4xx for a damaged one.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

Span = tuple[int, int]  # a box's payload: [start, end) in the file


@dataclass(frozen=True, slots=True)
class ClipHeader:
    num_frames: int
    fps: float
    width: int
    height: int


def clip_header(data: bytes) -> ClipHeader | None:
    moov = _child(data, (0, len(data)), b"moov")
    if moov is None:
        return None
    for trak in _children(data, moov, b"trak"):
        header = _video_track(data, trak)
        if header is not None:
            return header
    return None


def _video_track(data: bytes, trak: Span) -> ClipHeader | None:
    mdia = _child(data, trak, b"mdia")
    hdlr = _child(data, mdia, b"hdlr") if mdia else None
    if mdia is None or hdlr is None or data[hdlr[0] + 8 : hdlr[0] + 12] != b"vide":
        return None
    tkhd, mdhd = _child(data, trak, b"tkhd"), _child(data, mdia, b"mdhd")
    stbl = _path(data, mdia, (b"minf", b"stbl"))
    stsz = _child(data, stbl, b"stsz") if stbl else None
    if tkhd is None or mdhd is None or stsz is None:
        return None
    try:  # a box's version is its payload's first byte (1: 64-bit times and a longer layout)
        wide = data[tkhd[0] : tkhd[0] + 1] == b"\x01"
        width, height = struct.unpack_from(">II", data, tkhd[0] + (88 if wide else 76))
        if data[mdhd[0] : mdhd[0] + 1] == b"\x01":
            timescale, duration = struct.unpack_from(">IQ", data, mdhd[0] + 20)
        else:
            timescale, duration = struct.unpack_from(">II", data, mdhd[0] + 12)
        (num_frames,) = struct.unpack_from(">I", data, stsz[0] + 8)
    except struct.error:
        return None
    if not (num_frames and timescale and duration and width >> 16 and height >> 16):
        return None
    return ClipHeader(num_frames, num_frames / (duration / timescale), width >> 16, height >> 16)


def _boxes(data: bytes, span: Span) -> Iterator[tuple[bytes, Span]]:
    """(type, payload) of each box in ``span``; stops at the first malformed one."""
    at, end = span
    while at + 8 <= end:
        size, kind = struct.unpack_from(">I4s", data, at)
        header = 8
        if size == 1 and at + 16 <= end:
            (size,) = struct.unpack_from(">Q", data, at + 8)
            header = 16
        elif size == 0:
            size = end - at
        if size < header or at + size > end:
            return
        yield kind, (at + header, at + size)
        at += size


def _children(data: bytes, span: Span, kind: bytes) -> Iterator[Span]:
    return (payload for found, payload in _boxes(data, span) if found == kind)


def _child(data: bytes, span: Span, kind: bytes) -> Span | None:
    return next(_children(data, span, kind), None)


def _path(data: bytes, span: Span, kinds: tuple[bytes, ...]) -> Span | None:
    for kind in kinds:
        found = _child(data, span, kind)
        if found is None:
            return None
        span = found
    return span
