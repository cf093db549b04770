"""Video records every family with video shares, and the step that turns sampled frames into
temporal groups.

A clip is sampled (frame indices from the family's sampler, equal to transformers'), resized to
one size for every frame, normalized, and cut into temporal groups of ``temporal_patch_size``
frames (the last frame repeated to fill the last group). The Qwen towers attend within one
group (their ``cu_seqlens`` restart at each), and a group's rotary positions depend only on its
height and width, so each group is encoded alone and is its own cache unit: a ProcessedImage of
grid (1, h, w), whose rows are the rows transformers' video patchify gives that group.

How a group's rows are made, and why they are transformers' own: the clip's frames are resized
as one batch (torchvision's resize, services/models/tensor_pixels.py), rescaled, normalized and
patchified as an image batch, which gives each frame's patches with the frame repeated in every
temporal slot, in the same patch order as the video patchify; a group takes temporal slot 0 of
each of its frames (tests/services/models/test_reference_pixels.py holds the groups equal to
transformers' own video processors, with torchvision).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from services.models.family import ProcessedImage
from services.models.media_cost import ClipCost
from shared.types import GroupPlacement

if TYPE_CHECKING:
    import torch
    from PIL import Image


class VideoProcessingError(ValueError):
    """A clip the family's processor cannot take (too few frames, an aspect ratio it refuses)."""


@dataclass(frozen=True, slots=True)
class VideoMetadata:
    """What a sampler reads of a clip (transformers' VideoMetadata, the fields it uses)."""

    num_frames: int
    fps: float
    width: int
    height: int


VIDEO_OPTION_NAMES = ("fps", "num_frames", "min_frames", "max_frames", "min_pixels", "max_pixels")


@dataclass(frozen=True, slots=True)
class VideoOptions:
    """A request's video processor settings (``mm_processor_kwargs``); None keeps the model's."""

    fps: float | None = None
    num_frames: int | None = None
    min_frames: int | None = None
    max_frames: int | None = None
    min_pixels: int | None = None
    max_pixels: int | None = None

    def __post_init__(self) -> None:
        for name in VIDEO_OPTION_NAMES:
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"mm_processor_kwargs.{name} must be positive, got {value}")
        if self.fps is not None and self.num_frames is not None:
            raise ValueError("mm_processor_kwargs: fps and num_frames are mutually exclusive, give one")
        for low, high in (("min_frames", "max_frames"), ("min_pixels", "max_pixels")):
            if getattr(self, low) is not None and getattr(self, high) is not None and getattr(self, low) > getattr(self, high):
                raise ValueError(f"mm_processor_kwargs.{low} must not exceed {high}")

    def over(self, defaults: VideoOptions) -> VideoOptions:
        """These settings over a deployment's defaults, as vLLM merges a request's over
        ``--mm-processor-kwargs``: a request's ``fps`` drops a default ``num_frames``, and the
        other way round, since the two choose the frames together."""
        merged = {name: getattr(defaults, name) for name in VIDEO_OPTION_NAMES}
        if self.fps is not None:
            merged["num_frames"] = None
        if self.num_frames is not None:
            merged["fps"] = None
        merged.update(self.as_dict())
        return VideoOptions(**merged)

    def as_dict(self) -> dict[str, float | int]:
        """The settings given, for a video's identity."""
        return {name: getattr(self, name) for name in VIDEO_OPTION_NAMES if getattr(self, name) is not None}


@dataclass(frozen=True, slots=True)
class ProcessedVideo:
    """One clip as temporal groups, in order. ``placements[k]``: where group k sits in the clip
    for M-RoPE (Qwen2-VL and Qwen2.5-VL place a clip's groups at one start, spaced on the temporal
    axis), or None where the group is positioned as an image (Qwen3-VL). A placement is part of
    the group's identity, since the KV after it depends on it; the tower's output does not.
    ``timestamps[k]``: the seconds Qwen3-VL writes before group k (empty for the others)."""

    groups: tuple[ProcessedImage, ...]
    placements: tuple[GroupPlacement | None, ...]
    timestamps: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class SampledClip:
    """The sampler's choice for one clip: frame indices, and the settings that produced them."""

    indices: tuple[int, ...]
    metadata: VideoMetadata


class VideoProcessor(Protocol):
    temporal_patch_size: int

    def kwargs_for_hash(self, options: VideoOptions) -> dict[str, object]:
        """Every sampler and processor setting that changes a clip's groups, for its identity."""

    def sample(self, metadata: VideoMetadata, options: VideoOptions) -> SampledClip:
        """Frame indices, as transformers' sampler picks them for the same metadata."""

    def process(self, frames: Sequence[Image.Image], clip: SampledClip, options: VideoOptions) -> ProcessedVideo:
        """The sampled frames (in ``clip.indices`` order) as temporal groups."""

    def num_tokens(self, grid_thw: tuple[int, int, int]) -> int: ...

    def clip_cost(self, defaults: VideoOptions) -> ClipCost:
        """How the gateway prices a clip before admitting it (media_cost.py), under the
        deployment's ``defaults``."""


def transformers_video_processor(model_dir: Path, default: str) -> str:
    """The video processor class transformers' AutoVideoProcessor builds for this checkpoint, by
    name, found as it finds it: the video processor file's ``video_processor_type``; else the
    image processor's type renamed (a checkpoint with only preprocessor_config.json gets the
    video processor of its image processor's name, a Qwen3-VL one Qwen2VLVideoProcessor); else
    the model config's; else ``default``, the model type's own."""
    from transformers import AutoConfig
    from transformers.video_processing_utils import BaseVideoProcessor

    found, _ = BaseVideoProcessor.get_video_processor_dict(str(model_dir))
    if found.get("video_processor_type"):
        return str(found["video_processor_type"])
    image_type = str(found.get("image_processor_type") or "")
    if image_type.removesuffix("Pil").endswith("ImageProcessor"):
        inferred = image_type.removesuffix("Pil").replace("ImageProcessor", "VideoProcessor")
        if inferred in KNOWN_VIDEO_PROCESSORS:
            return inferred
    return str(getattr(AutoConfig.from_pretrained(str(model_dir)), "video_processor_type", None) or default)


# The transformers video processors whose sampler and size rule Tessera follows.
KNOWN_VIDEO_PROCESSORS = ("Qwen2VLVideoProcessor", "Qwen3VLVideoProcessor")


def group_rows(frame_rows: Sequence[torch.Tensor], temporal_patch_size: int, channels: int) -> list[torch.Tensor]:
    """Temporal groups from per-frame patch rows.

    ``frame_rows[i]``: the image processor's rows for frame i, (num_patches, C * T * p * p), the
    frame repeated in its T temporal slots. Returns one (num_patches, C * T * p * p) tensor per
    group of T frames, slot j holding frame j of the group (the last frame repeats to fill the
    last group, as transformers' video patchify pads)."""
    import torch

    frames = list(frame_rows)
    frames += [frames[-1]] * (-len(frames) % temporal_patch_size)
    groups = []
    for start in range(0, len(frames), temporal_patch_size):
        slots = []
        for rows in frames[start : start + temporal_patch_size]:
            num_patches = rows.shape[0]
            slots.append(rows.view(num_patches, channels, temporal_patch_size, -1)[:, :, 0])
        stacked = torch.stack(slots, dim=2)  # (num_patches, C, T, p*p)
        groups.append(stacked.reshape(stacked.shape[0], -1).contiguous())
    return groups
