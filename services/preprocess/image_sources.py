"""Turn a request's image (an ImageInput, prompt.py: its bytes, or a reference) into encoded bytes, enforcing
the source policy.

Accepted references (ImageInput.url):
  data:image/...;base64,...       always (png, jpeg, webp, gif)
  bare base64 string               always (the ``{"type": "image", "image": ...}`` form)
  http(s)://host/...               only with allow_remote_images, host on the allow-list and
                                   resolving to public addresses (services/preprocess/remote_fetch.py)
  file:///abs/path or /abs/path    only under local_media_dir (after resolving symlinks)
The encoded-size limit is enforced here, before any decoding.
"""

from __future__ import annotations

import base64
import binascii
import re
import urllib.parse
from pathlib import Path

from services.preprocess.config import PreprocessConfig
from services.preprocess.errors import (
    ImageFetchError,
    ImageSourceNotAllowedError,
    ImageTooLargeError,
    InvalidImageDataError,
)
from services.preprocess.prompt import ImageInput
from services.preprocess.remote_fetch import FetchPolicy, fetch

_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[\w.+-]+)*)(?P<b64>;base64)?,", re.I)
_BASE64_CHARS = re.compile(r"^[A-Za-z0-9+/=\s_-]+$")


def load_image(image: ImageInput, config: PreprocessConfig) -> bytes:
    """Encoded image bytes of ``image``; raises a typed PreprocessError on any violation."""
    if image.data is not None:
        if not image.data:
            raise InvalidImageDataError("image data is empty")
        _check_size(len(image.data), config)
        return image.data
    return load_image_bytes(image.url, config)


def remote_url(image: ImageInput) -> str | None:
    """The http(s) URL ``image`` is fetched from, if it is a remote one."""
    if image.url is None or not image.url[:8].lower().startswith(("http://", "https://")):
        return None
    return image.url


def load_image_bytes(reference: str, config: PreprocessConfig) -> bytes:
    """Encoded image bytes for ``reference``; raises a typed PreprocessError on any violation."""
    if not isinstance(reference, str) or not reference:
        raise InvalidImageDataError("image reference must be a non-empty string")
    if reference.startswith("data:"):
        return _from_data_url(reference, config)
    lowered = reference[:8].lower()
    if lowered.startswith(("http://", "https://")):
        return _from_remote(reference, config)
    if lowered.startswith("file://") or reference.startswith("/"):
        return _from_local_path(reference, config)
    return _from_base64(reference, config, what="image")


def _check_size(num_bytes: int, config: PreprocessConfig) -> None:
    if num_bytes > config.max_image_bytes:
        raise ImageTooLargeError(f"encoded image is {num_bytes} bytes, over the limit of {config.max_image_bytes} bytes")


def _from_base64(payload: str, config: PreprocessConfig, *, what: str) -> bytes:
    # base64 inflates by 4/3: reject oversized payloads before decoding them.
    _check_size(len(payload) * 3 // 4 - 2, config)
    if not _BASE64_CHARS.match(payload):
        raise InvalidImageDataError(f"{what} is not valid base64 (unexpected characters)")
    compact = "".join(payload.split())
    try:
        if "-" in compact or "_" in compact:
            data = base64.urlsafe_b64decode(compact + "=" * (-len(compact) % 4))
        else:
            data = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidImageDataError(f"{what} is not valid base64: {exc}") from None
    if not data:
        raise InvalidImageDataError(f"{what} is empty after base64 decoding")
    _check_size(len(data), config)
    return data


def _from_data_url(url: str, config: PreprocessConfig) -> bytes:
    match = _DATA_URL.match(url)
    if match is None:
        raise InvalidImageDataError("malformed data URL: expected data:image/<type>;base64,<data>")
    mime = (match.group("mime") or "").lower()
    if mime and not mime.startswith("image/"):
        raise InvalidImageDataError(f"data URL has media type {mime!r}, expected image/*")
    body = url[match.end() :]
    if not match.group("b64"):
        raise InvalidImageDataError("data URL must be base64-encoded (;base64,)")
    return _from_base64(body, config, what="data URL payload")


def _from_remote(url: str, config: PreprocessConfig) -> bytes:
    if not config.allow_remote_images:
        raise ImageSourceNotAllowedError("remote image URLs are disabled; send the image as a data URL or enable allow_remote_images")
    policy = FetchPolicy(
        allowed_domains=config.allowed_image_domains,
        allow_private_addresses=config.allow_private_image_addresses,
        timeout_s=config.remote_fetch_timeout_s,
        max_bytes=config.max_image_bytes,
    )
    return fetch(url, policy)


def _from_local_path(reference: str, config: PreprocessConfig) -> bytes:
    if config.local_media_dir is None:
        raise ImageSourceNotAllowedError("local image paths are disabled; set local_media_dir to allow them")
    raw_path = urllib.parse.unquote(urllib.parse.urlsplit(reference).path) if reference.startswith("file:") else reference
    root = Path(config.local_media_dir).resolve()
    path = Path(raw_path).resolve()
    if not path.is_relative_to(root):
        raise ImageSourceNotAllowedError(f"image path {raw_path!r} is outside the allowed media directory")
    try:
        size = path.stat().st_size
        _check_size(size, config)
        return path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        raise ImageFetchError(f"could not read image file {raw_path!r}: {exc.strerror}") from None
