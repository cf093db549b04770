"""Typed preprocessing errors. Each carries the kind of error it is to the gateway (which alone
picks the HTTP status, services/gateway/error_kinds.py) and a stable machine-readable code, so the
gateway can answer with a 4xx that says exactly what was wrong."""

from __future__ import annotations

from services.transport.node_error import ErrorKind


class PreprocessError(Exception):
    """Base class: the request is at fault, never the service."""

    kind = ErrorKind.INVALID_REQUEST
    code = "invalid_request"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequestError(PreprocessError):
    """A prompt this role refuses (services/preprocess/prompt_input.py): none given, no messages,
    a bad role, an image outside a user turn, bad template variables, token ids outside the
    vocabulary; or a template that cannot render the conversation."""

    code = "invalid_request"


class InvalidImageDataError(PreprocessError):
    """Bytes that are not a decodable image: bad base64, non-image data, truncated file."""

    code = "invalid_image"


class ImageTooLargeError(PreprocessError):
    """Encoded bytes or decoded pixel count over the configured limit (decompression bombs)."""

    kind = ErrorKind.IMAGE_TOO_LARGE
    code = "image_too_large"


class InvalidVideoDataError(PreprocessError):
    """Bytes that are not a decodable video: not a container, no video stream, an unsupported
    codec, no frames, an unknown or zero frame rate, a truncated file; or a model without video."""

    code = "invalid_video"


class VideoTooLargeError(PreprocessError):
    """Encoded bytes, duration, sampled frames or decoded pixels over the configured limit,
    checked from the header before any frame is decoded."""

    kind = ErrorKind.IMAGE_TOO_LARGE  # the media-too-large kind: 413
    code = "video_too_large"


class InvalidImageDimensionsError(PreprocessError):
    """Zero-sized images, or an aspect ratio the model cannot represent."""

    code = "invalid_image_dimensions"


class TooManyImagesError(PreprocessError):
    code = "too_many_images"


class ImageSourceNotAllowedError(PreprocessError):
    """A remote URL while fetching is disabled or off the allow-list, or a path outside the
    configured media directory."""

    kind = ErrorKind.IMAGE_SOURCE_NOT_ALLOWED
    code = "image_source_not_allowed"


class ImageFetchError(PreprocessError):
    """An allowed remote URL or local file that could not be read."""

    code = "image_fetch_failed"


class PlaceholderMismatchError(PreprocessError):
    """The number of image placeholders in the prompt differs from the number of images."""

    code = "placeholder_mismatch"


class PromptTooLongError(PreprocessError):
    code = "prompt_too_long"


class MediaUuidConflictError(PreprocessError):
    """A client uuid sent with other bytes than the ones it is bound to (media_uuids.py)."""

    kind = ErrorKind.MEDIA_ID_CONFLICT
    code = "uuid_conflict"


class MediaUuidUnboundError(PreprocessError):
    """A client uuid sent without bytes that no live binding resolves, or whose content is no
    longer cached where it is needed: the client must send the bytes."""

    code = "uuid_not_bound"
