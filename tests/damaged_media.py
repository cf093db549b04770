"""Damaged and hostile media, as a hostile client sends them: image headers that lie (a
decompression bomb, zero or huge sides), truncated files in each format the preprocess node
decodes, and MP4s whose boxes lie (truncated, a flipped box type, a box claiming gigabytes, 2^31
samples, no frames, no rate, absurd sizes). Each case is a name and its bytes; built by hand from
the formats' specifications, so they share nothing with the code that reads them."""

from __future__ import annotations

import struct
import zlib

from tests.factories import encode_image, make_clip, make_image


def _png_chunk(kind: bytes, data: bytes = b"") -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_header(width: int, height: int) -> bytes:
    """A whole PNG file of 45 bytes: its signature, an IHDR chunk stating the size (8-bit RGB) and
    IEND, with no pixels (what PIL's bomb check sees as 60000x60000, given that size)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IEND")


def jpeg_header(width: int, height: int) -> bytes:
    """SOI and a baseline SOF0 segment stating the size (3 components), and no scan."""
    components = b"".join(bytes([i, 0x11, 0]) for i in (1, 2, 3))
    sof = struct.pack(">BHHB", 8, height, width, 3) + components
    return b"\xff\xd8" + b"\xff\xc0" + struct.pack(">H", len(sof) + 2) + sof


def gif_header(width: int, height: int) -> bytes:
    """A GIF89a logical screen stating the size, no colour table, and no image."""
    return b"GIF89a" + struct.pack("<HHBBB", width, height, 0, 0, 0) + b";"


def webp_header(width: int, height: int) -> bytes:
    """A RIFF WEBP file with an extended (VP8X) header stating the canvas size, and no image."""
    vp8x = b"\x00\x00\x00\x00" + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    chunk = b"VP8X" + struct.pack("<I", len(vp8x)) + vp8x
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk


def damaged_images() -> dict[str, bytes]:
    """Image bytes that the preprocess node must refuse with a 4xx (none is a usable image)."""
    png = encode_image(make_image(64, 48, seed=3))
    jpeg = encode_image(make_image(64, 48, seed=3), "JPEG")
    webp = encode_image(make_image(64, 48, seed=3), "WEBP")
    ihdr_at = png.index(b"IHDR")
    return {
        "png bomb 60000x60000": png_header(60000, 60000),
        "png 0x0": png_header(0, 0),
        "png 0x48": png_header(0, 48),
        "png 2^31-1 wide": png_header(2**31 - 1, 1),
        "png truncated": png[: len(png) // 2],
        "png header only": png[:33],
        "png bad crc": png[: ihdr_at + 6] + bytes([png[ihdr_at + 6] ^ 0xFF]) + png[ihdr_at + 7 :],
        "jpeg 0x0": jpeg_header(0, 0),
        "jpeg bomb 65535x65535": jpeg_header(65535, 65535),
        "jpeg truncated": jpeg[: len(jpeg) // 3],
        "gif 0x0": gif_header(0, 0),
        "gif 65535x65535 without an image": gif_header(65535, 65535),
        "webp bomb 16384x16384": webp_header(16384, 16384),
        "webp truncated": webp[: len(webp) // 2],
        "not an image": b"hello, world",
        "empty": b"",
    }


def _patched(data: bytes, at: int, value: bytes) -> bytes:
    return data[:at] + value + data[at + len(value) :]


def _box_at(data: bytes, kind: bytes) -> int:
    """Where the box of type ``kind`` starts (its size field); the clips here hold one of each."""
    assert data.count(kind) == 1, kind
    return data.index(kind) - 4


def mp4_clip() -> bytes:
    return make_clip(20, 10, 64, 48)


def damaged_clips() -> dict[str, bytes]:
    """MP4 bytes that the preprocess node must refuse with a 4xx."""
    clip = mp4_clip()
    moov, mdat, stsz = _box_at(clip, b"moov"), _box_at(clip, b"mdat"), _box_at(clip, b"stsz")
    return {
        "truncated": clip[: len(clip) // 2],
        "truncated to its first box": clip[:32],
        "moov type flipped": _patched(clip, moov + 4, b"mXov"),
        "mdat claiming 4 GB": _patched(clip, mdat, struct.pack(">I", 0xFFFFFFF0)),
        "stsz claiming 4 GB": _patched(clip, stsz, struct.pack(">I", 0xFFFFFFF0)),
        "moov with a 64-bit size past the file": _patched(clip, moov, struct.pack(">I", 1)),
        "2^31 samples": _patched(clip, stsz + 16, struct.pack(">I", 2**31)),
        "all ones": b"\xff" * 4096,
    }


def lying_clip_headers() -> dict[str, bytes]:
    """MP4s whose headers state no usable clip (no frames, no rate, absurd sizes): the gateway
    prices them as a typical clip or by what they state, and the preprocess node, which decodes
    the clip, answers them (a 4xx, or a reply where FFmpeg reads the clip regardless)."""
    clip = mp4_clip()
    moov, stsz, mdhd, tkhd = (_box_at(clip, kind) for kind in (b"moov", b"stsz", b"mdhd", b"tkhd"))
    # mdhd v0 payload: version+flags, creation, modification, timescale, duration (4 bytes each);
    # tkhd v0: the width and height (16.16 fixed point) at payload offsets 76 and 80.
    return {
        "moov claiming 4 GB": _patched(clip, moov, struct.pack(">I", 0xFFFFFFF0)),
        "no frames": _patched(clip, stsz + 16, struct.pack(">I", 0)),
        "zero timescale": _patched(clip, mdhd + 20, struct.pack(">I", 0)),
        "zero duration": _patched(clip, mdhd + 24, struct.pack(">I", 0)),
        "65535x65535 track": _patched(clip, tkhd + 84, struct.pack(">II", 0xFFFF0000, 0xFFFF0000)),
        "0x0 track": _patched(clip, tkhd + 84, struct.pack(">II", 0, 0)),
    }
