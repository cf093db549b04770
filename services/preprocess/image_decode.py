"""Safe image decoding: header checks before pixels are allocated, then a full decode.

Order of checks: open (format sniffing) -> dimensions from the header (zero size, pixel budget,
aspect ratio) -> full decode (catches truncation) -> first frame only for animations.
"""

from __future__ import annotations

import io
import warnings

from PIL import Image, UnidentifiedImageError

from services.preprocess.config import PreprocessConfig
from services.preprocess.errors import ImageTooLargeError, InvalidImageDataError, InvalidImageDimensionsError

SUPPORTED_FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
# Qwen2-VL's smart_resize rejects aspect ratios above 200.
MAX_ASPECT_RATIO = 200


_SIGNATURES = {
    b"\x89PNG\r\n\x1a\n": "PNG",
    b"\xff\xd8\xff": "JPEG",
    b"GIF87a": "GIF",
    b"GIF89a": "GIF",
}


def _unidentified(data: bytes) -> Exception:
    """Explain why PIL refused the data: a known format with a bad header, or not an image."""
    fmt = next((name for sig, name in _SIGNATURES.items() if data.startswith(sig)), None)
    if fmt is None and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        fmt = "WEBP"
    if fmt is None:
        return InvalidImageDataError(f"data is not a supported image (expected one of {', '.join(SUPPORTED_FORMATS).lower()})")
    if fmt == "PNG" and len(data) >= 24 and data[12:16] == b"IHDR":
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        if width == 0 or height == 0:
            return InvalidImageDimensionsError(f"image has zero size ({width}x{height})")
    return InvalidImageDataError(f"{fmt} image header is corrupt and could not be parsed")


def decode_image(data: bytes, config: PreprocessConfig) -> Image.Image:
    """A fully loaded PIL image (first frame for animations), in its original mode."""
    try:
        with warnings.catch_warnings():
            # PIL's own bomb check warns or raises at its global limit; ours is the per-config one.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=SUPPORTED_FORMATS)
    except UnidentifiedImageError:
        raise _unidentified(data) from None
    except Image.DecompressionBombError as exc:
        raise ImageTooLargeError(f"image dimensions exceed the decoder's safety limit: {exc}") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise InvalidImageDataError(f"image header could not be parsed: {exc}") from None

    width, height = image.size
    if width <= 0 or height <= 0:
        raise InvalidImageDimensionsError(f"image has zero size ({width}x{height})")
    if width * height > config.max_image_pixels:
        raise ImageTooLargeError(f"image is {width}x{height} = {width * height} pixels, over the limit of {config.max_image_pixels}")
    if max(width, height) / min(width, height) > MAX_ASPECT_RATIO:
        raise InvalidImageDimensionsError(f"image aspect ratio {max(width, height) / min(width, height):.1f} exceeds {MAX_ASPECT_RATIO}")
    try:
        image.seek(0)
        image.load()
    except Image.DecompressionBombError as exc:
        raise ImageTooLargeError(f"image dimensions exceed the decoder's safety limit: {exc}") from None
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise InvalidImageDataError(f"image data is corrupt or truncated: {exc}") from None
    if getattr(image, "n_frames", 1) > 1:
        # Detach the first frame from the multi-frame container.
        image = image.copy()
    return image
