"""Turn a request's image or video (an ImageInput or VideoInput, prompt.py: its bytes, or a
reference) into encoded bytes, enforcing the source policy, the same for both kinds.

Accepted references (the input's url):
  data:image/...;base64,...       always (png, jpeg, webp, gif); data:video/... for a video
  bare base64 string               always (the ``{"type": "image", "image": ...}`` form)
  http(s)://host/...               unless allow_remote_images is off: a host resolving to public
                                   addresses, on allowed_image_domains when that is set
                                   (services/preprocess/remote_fetch.py)
  file:///abs/path or /abs/path    only under local_media_dir (after resolving symlinks)
The encoded-size limit (max_image_bytes or max_video_bytes) is enforced here, before any decoding.
"""

from __future__ import annotations

import base64
import binascii
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from services.preprocess.config import PreprocessConfig
from services.preprocess.errors import (
    ImageFetchError,
    ImageSourceNotAllowedError,
    ImageTooLargeError,
    InvalidImageDataError,
    InvalidVideoDataError,
    PreprocessError,
    VideoTooLargeError,
)
from services.preprocess.prompt import ImageInput, VideoInput
from services.preprocess.remote_fetch import FetchPolicy, fetch

_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[\w.+-]+)*)(?P<b64>;base64)?,", re.I)
_BASE64_CHARS = re.compile(r"^[A-Za-z0-9+/=\s_-]+$")


@dataclass(frozen=True, slots=True)
class MediaKind:
    name: str  # "image" or "video": the data URL's media type and the messages' word
    too_large: type[PreprocessError]
    invalid: type[PreprocessError]

    def max_bytes(self, config: PreprocessConfig) -> int:
        return config.max_image_bytes if self.name == "image" else config.max_video_bytes


IMAGE = MediaKind("image", ImageTooLargeError, InvalidImageDataError)
VIDEO = MediaKind("video", VideoTooLargeError, InvalidVideoDataError)


def load_image(image: ImageInput, config: PreprocessConfig) -> bytes:
    """Encoded image bytes of ``image``; raises a typed PreprocessError on any violation."""
    return load_media(image, config, IMAGE)


def load_media(media: ImageInput | VideoInput, config: PreprocessConfig, kind: MediaKind) -> bytes:
    if media.data is not None:
        if not media.data:
            raise kind.invalid(f"{kind.name} data is empty")
        _check_size(len(media.data), config, kind)
        return media.data
    return load_media_bytes(media.url, config, kind)


def remote_url(media: ImageInput | VideoInput) -> str | None:
    """The http(s) URL ``media`` is fetched from, if it is a remote one."""
    if media.url is None or not media.url[:8].lower().startswith(("http://", "https://")):
        return None
    return media.url


def load_image_bytes(reference: str, config: PreprocessConfig) -> bytes:
    return load_media_bytes(reference, config, IMAGE)


def load_media_bytes(reference: str, config: PreprocessConfig, kind: MediaKind) -> bytes:
    """Encoded bytes for ``reference``; raises a typed PreprocessError on any violation."""
    if not isinstance(reference, str) or not reference:
        raise kind.invalid(f"{kind.name} reference must be a non-empty string")
    if reference.startswith("data:"):
        return _from_data_url(reference, config, kind)
    lowered = reference[:8].lower()
    if lowered.startswith(("http://", "https://")):
        return _from_remote(reference, config, kind)
    if lowered.startswith("file://") or reference.startswith("/"):
        return _from_local_path(reference, config, kind)
    return _from_base64(reference, config, kind, what=kind.name)


def _check_size(num_bytes: int, config: PreprocessConfig, kind: MediaKind) -> None:
    limit = kind.max_bytes(config)
    if num_bytes > limit:
        raise kind.too_large(f"encoded {kind.name} is {num_bytes} bytes, over the limit of {limit} bytes (max_{kind.name}_bytes)")


def _from_base64(payload: str, config: PreprocessConfig, kind: MediaKind, *, what: str) -> bytes:
    # base64 inflates by 4/3: reject oversized payloads before decoding them.
    _check_size(len(payload) * 3 // 4 - 2, config, kind)
    if not _BASE64_CHARS.match(payload):
        raise kind.invalid(f"{what} is not valid base64 (unexpected characters)")
    compact = "".join(payload.split())
    try:
        if "-" in compact or "_" in compact:
            data = base64.urlsafe_b64decode(compact + "=" * (-len(compact) % 4))
        else:
            data = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise kind.invalid(f"{what} is not valid base64: {exc}") from None
    if not data:
        raise kind.invalid(f"{what} is empty after base64 decoding")
    _check_size(len(data), config, kind)
    return data


def _from_data_url(url: str, config: PreprocessConfig, kind: MediaKind) -> bytes:
    match = _DATA_URL.match(url)
    if match is None:
        raise kind.invalid(f"malformed data URL: expected data:{kind.name}/<type>;base64,<data>")
    mime = (match.group("mime") or "").lower()
    if mime and not mime.startswith(f"{kind.name}/"):
        raise kind.invalid(f"data URL has media type {mime!r}, expected {kind.name}/*")
    body = url[match.end() :]
    if not match.group("b64"):
        raise kind.invalid("data URL must be base64-encoded (;base64,)")
    return _from_base64(body, config, kind, what="data URL payload")


def _from_remote(url: str, config: PreprocessConfig, kind: MediaKind) -> bytes:
    if not config.allow_remote_images:
        raise ImageSourceNotAllowedError(
            f"remote {kind.name} URLs are disabled; send the {kind.name} as a data URL or enable allow_remote_images"
        )
    policy = FetchPolicy(
        allowed_domains=config.allowed_image_domains,
        allow_private_addresses=config.allow_private_image_addresses,
        timeout_s=config.remote_fetch_timeout_s,
        max_bytes=kind.max_bytes(config),
    )
    return fetch(url, policy)


def _from_local_path(reference: str, config: PreprocessConfig, kind: MediaKind) -> bytes:
    if config.local_media_dir is None:
        raise ImageSourceNotAllowedError(f"local {kind.name} paths are disabled; set local_media_dir to allow them")
    raw_path = urllib.parse.unquote(urllib.parse.urlsplit(reference).path) if reference.startswith("file:") else reference
    root = Path(config.local_media_dir).resolve()
    path = Path(raw_path).resolve()
    if not path.is_relative_to(root):
        raise ImageSourceNotAllowedError(f"{kind.name} path {raw_path!r} is outside the allowed media directory")
    try:
        size = path.stat().st_size
        _check_size(size, config, kind)
        return path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        raise ImageFetchError(f"could not read {kind.name} file {raw_path!r}: {exc.strerror}") from None
