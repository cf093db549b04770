"""The request fields for video, as vLLM's OpenAI server takes them: the chat part
``{"type": "video_url", "video_url": {"url": ...}, "uuid": ...}``, ``multi_modal_data.video`` and
``videos`` beside a raw prompt, and ``mm_processor_kwargs`` (the video sampler's and processor's
settings, per request). Unknown processor settings are refused by name: they would change the
output, so they may not be ignored.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from services.gateway.protocol.wire_base import NonEmptyStr, WireModel
from services.models.video import VideoOptions

MediaUuid = Annotated[str, Field(min_length=1, max_length=256)]


class VideoUrl(WireModel):
    url: NonEmptyStr = Field(description="a data:video/... URL, an http(s) URL (remote media rules), or a file under --local-media-dir")


def needs_source_or_uuid(part, source, name: str):
    """A media part without bytes or a URL names, by its uuid, media sent before (vLLM's
    ``{"image_url": null, "uuid": ...}``): the uuid is then required."""
    if source is None and part.uuid is None:
        raise ValueError(f"{name} may be null only with the uuid of media sent before")
    return part


class VideoUrlPart(WireModel):
    type: Literal["video_url"]
    video_url: VideoUrl | NonEmptyStr | None = Field(description="null: the clip its uuid was sent with before")
    uuid: MediaUuid | None = None

    @model_validator(mode="after")
    def _has_source(self):
        return needs_source_or_uuid(self, self.video_url, "video_url")

    @property
    def url(self) -> str | None:
        return self.video_url if not isinstance(self.video_url, VideoUrl) else self.video_url.url


class VideoRef(WireModel):
    url: NonEmptyStr | None = None  # None: the clip its uuid was sent with before
    uuid: MediaUuid | None = None

    @model_validator(mode="after")
    def _has_source(self):
        return needs_source_or_uuid(self, self.url, "a video's url")


class MmProcessorKwargs(WireModel):
    """The video processor settings a request may set; unset ones keep the model's."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    fps: float | int | None = Field(None, gt=0, le=240, description="frames sampled per second (exclusive with num_frames)")
    num_frames: int | None = Field(None, ge=1, le=100_000)
    min_frames: int | None = Field(None, ge=1, le=100_000)
    max_frames: int | None = Field(None, ge=1, le=100_000)
    min_pixels: int | None = Field(None, ge=1, le=2**40)
    max_pixels: int | None = Field(None, ge=1, le=2**40)

    @model_validator(mode="after")
    def _consistent(self) -> MmProcessorKwargs:
        VideoOptions(**self.model_dump(exclude_none=True))  # the preprocess role's own checks, at the edge
        return self
