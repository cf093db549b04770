"""Qwen2-VL / Qwen2.5-VL video processing as transformers' Qwen2VLVideoProcessor does it: its
sampler, per-frame size, torchvision's resize of the frames (services/models/tensor_pixels.py) and
patch layout (services/models/video.py says how the groups are made).

Settings are read as transformers' video processor reads them: ``processor_config.json``, else
``video_preprocessor_config.json``, else ``preprocessor_config.json`` (BaseVideoProcessor's own
lookup), over the class's defaults. Transformers' Qwen2VLVideoProcessor cannot be imported here
(its module imports torchvision), so its defaults are written below;
tests/services/models/test_reference_pixels.py checks them against the class itself.

Sampling: transformers' Qwen2-VL sampler (frames at ``fps`` per second within [min_frames,
max_frames], a multiple of temporal_patch_size, spread by ``arange(0, n, n / k)``). Where
neither the request nor the checkpoint asks for sampling, the clip is sampled at 2 frames per
second (qwen-vl-utils' default), not decoded whole as transformers' processor would.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch
from PIL import Image

from services.models.family import ProcessedImage
from services.models.media_cost import ClipCost
from services.models.qwen2_vl.image_processor import patch_rows
from services.models.tensor_pixels import PIXEL_BACKEND, PixelSettings, image_tensor, rescale_and_normalize, resize, stacked
from services.models.video import ProcessedVideo, SampledClip, VideoMetadata, VideoOptions, VideoProcessingError, group_rows
from shared.types import GroupPlacement

# transformers.models.qwen2_vl.video_processing_qwen2_vl.Qwen2VLVideoProcessor's class defaults.
QWEN2_VL_VIDEO_DEFAULTS: dict[str, object] = {
    "size": {"shortest_edge": 128 * 28 * 28, "longest_edge": 28 * 28 * 768},
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "rescale_factor": 1 / 255,
    "resample": 3,  # bicubic
    "do_resize": True,
    "do_rescale": True,
    "do_normalize": True,
    "do_convert_rgb": True,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "min_frames": 4,
    "max_frames": 768,
    "do_sample_frames": False,
    "fps": None,
    "num_frames": None,
    "cap_pixels_per_frame": None,
    "max_video_tokens": 128000,
}
SERVING_FPS = 2.0  # the sampling rate where neither the request nor the checkpoint names one


def read_video_settings(model_dir: Path, defaults: dict[str, object]) -> dict[str, object]:
    """The checkpoint's video processor settings over ``defaults``, as transformers merges them
    (a legacy ``min_pixels`` / ``max_pixels`` overrides the size's edges)."""
    from transformers.video_processing_utils import BaseVideoProcessor

    found, _ = BaseVideoProcessor.get_video_processor_dict(str(model_dir))
    settings = {**defaults, **{k: v for k, v in found.items() if k in defaults and v is not None}}
    size = dict(settings["size"])
    for legacy, edge in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
        if found.get(legacy) is not None:
            size[edge] = found[legacy]
    settings["size"] = size
    return settings


class Qwen2VLVideoProcessor:
    rule = "Qwen2VLVideoProcessor"  # the transformers class whose sampler and size rule apply
    clip_pixel_budget = False  # max_pixels bounds each frame (Qwen3-VL: the whole clip)

    def __init__(self, model_dir: Path, hf_config, defaults: dict[str, object] = QWEN2_VL_VIDEO_DEFAULTS) -> None:
        self._settings = read_video_settings(model_dir, defaults)
        self._pixels = PixelSettings.of(self._settings.__getitem__)
        self.patch_size = int(self._settings["patch_size"])
        self.temporal_patch_size = int(self._settings["temporal_patch_size"])
        self.merge_size = int(self._settings["merge_size"])
        self._hf_config = hf_config

    # -- the protocol ---------------------------------------------------------------------

    def kwargs_for_hash(self, options: VideoOptions) -> dict[str, object]:
        settings = {**self._settings, "pixels": PIXEL_BACKEND, "rule": self.rule}
        return {**settings, "request": options.as_dict(), "serving_fps": SERVING_FPS}

    def sample(self, metadata: VideoMetadata, options: VideoOptions) -> SampledClip:
        num_frames = self._num_sampled(metadata, options)
        if num_frames > metadata.num_frames:
            raise VideoProcessingError(f"cannot sample {num_frames} frames from a video of {metadata.num_frames}: ask for fewer")
        if num_frames <= 0:
            raise VideoProcessingError(
                f"the video has {metadata.num_frames} frame(s); at least {self.temporal_patch_size} are needed at this sampling"
            )
        # transformers' own expression, so float rounding picks the same frames.
        indices = torch.arange(0, metadata.num_frames, metadata.num_frames / num_frames).int()
        return SampledClip(tuple(int(i) for i in indices.tolist()), metadata)

    def process(self, frames: Sequence[Image.Image], clip: SampledClip, options: VideoOptions) -> ProcessedVideo:
        height, width = self._target_size(clip, options)
        video = stacked([image_tensor(frame, convert_rgb=self._pixels.do_convert_rgb) for frame in frames])
        if self._pixels.do_resize:  # the frames as one batch, as transformers resizes a clip
            video = resize(video, height, width, self._pixels.resample)
        rows, _, _ = patch_rows(rescale_and_normalize(video, self._pixels), self.patch_size, self.merge_size, self.temporal_patch_size)
        groups = group_rows(list(rows), self.temporal_patch_size, channels=3)
        grid = (1, height // self.patch_size, width // self.patch_size)
        processed = tuple(ProcessedImage(pixel_values=g, grid_thw=grid, num_tokens=self.num_tokens(grid)) for g in groups)
        return ProcessedVideo(processed, self._placements(clip, len(groups)), self._timestamps(clip))

    def num_tokens(self, grid_thw: tuple[int, int, int]) -> int:
        t, h, w = grid_thw
        return t * h * w // self.merge_size**2

    def clip_cost(self, defaults: VideoOptions) -> ClipCost:
        settings, (min_pixels, max_pixels) = self._settings, self._size_bounds(defaults)
        fps = defaults.fps if defaults.fps is not None else settings["fps"] if defaults.num_frames is None else None
        num_frames = defaults.num_frames if defaults.num_frames is not None else settings["num_frames"] if defaults.fps is None else None
        return ClipCost(
            patch_size=self.patch_size,
            merge_size=self.merge_size,
            temporal_patch_size=self.temporal_patch_size,
            fps=fps,
            num_frames=num_frames,
            min_frames=defaults.min_frames or int(settings["min_frames"]),
            max_frames=defaults.max_frames or int(settings["max_frames"]),
            min_pixels=min_pixels,
            max_pixels=max_pixels,
            clip_pixel_budget=self.clip_pixel_budget,
        )

    # -- per family -----------------------------------------------------------------------

    def _num_sampled(self, metadata: VideoMetadata, options: VideoOptions) -> int:
        """Qwen2VLVideoProcessor.sample_frames' frame count."""
        tps, total = self.temporal_patch_size, metadata.num_frames
        num_frames = options.num_frames
        if num_frames is None and options.fps is None:
            num_frames = self._settings["num_frames"]
        if num_frames is not None:
            return round(num_frames / tps) * tps
        fps = options.fps if options.fps is not None else self._settings["fps"] or SERVING_FPS
        min_frames = options.min_frames if options.min_frames is not None else self._settings["min_frames"]
        max_frames = options.max_frames if options.max_frames is not None else self._settings["max_frames"]
        max_frames = math.floor(min(max_frames, total) / tps) * tps
        count = min(max(total / metadata.fps * fps, min_frames), max_frames, total)
        return math.floor(count / tps) * tps

    def _size_bounds(self, options: VideoOptions) -> tuple[int, int]:
        size = self._settings["size"]
        min_pixels = options.min_pixels if options.min_pixels is not None else int(size["shortest_edge"])
        max_pixels = options.max_pixels if options.max_pixels is not None else int(size["longest_edge"])
        return min_pixels, max_pixels

    def _target_size(self, clip: SampledClip, options: VideoOptions) -> tuple[int, int]:
        """Each frame's (height, width): the image rule with the video's per-frame bounds."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        min_pixels, max_pixels = self._size_bounds(options)
        factor = self.patch_size * self.merge_size
        if self._settings["cap_pixels_per_frame"]:
            total_pixels = int(int(self._settings["max_video_tokens"]) * factor * factor * 0.9)
            max_pixels = max(min(max_pixels, total_pixels * self.temporal_patch_size // len(clip.indices)), int(min_pixels * 1.05))
        try:
            return smart_resize(clip.metadata.height, clip.metadata.width, factor=factor, min_pixels=min_pixels, max_pixels=max_pixels)
        except ValueError as exc:
            raise VideoProcessingError(str(exc)) from None

    def _placements(self, clip: SampledClip, num_groups: int) -> tuple[GroupPlacement | None, ...]:
        """Group k's temporal position: k (Qwen2-VL), or its start in seconds times the vision
        config's tokens_per_second (Qwen2.5-VL: transformers' get_rope_index, same arithmetic)."""
        steps = torch.arange(num_groups)
        if self._hf_config.model_type == "qwen2_5_vl":
            metadata = clip.metadata
            sampled_fps = len(clip.indices) / metadata.num_frames * metadata.fps
            interval = self._hf_config.vision_config.tokens_per_second * (self.temporal_patch_size / sampled_fps)
            steps = (steps * interval).long()
        return tuple(GroupPlacement(index=k, time_position=int(t)) for k, t in enumerate(steps.tolist()))

    def _timestamps(self, clip: SampledClip) -> tuple[float, ...]:
        return ()
