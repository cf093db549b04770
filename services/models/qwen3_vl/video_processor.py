"""Qwen3-VL video processing: Qwen2-VL's frames-to-groups step, the ``<t seconds>`` each group is
written after (the processor's own timestamps), and the sampler and size rule of the video
processor transformers builds for the checkpoint (services/models/video.py,
``transformers_video_processor``): Qwen3VLVideoProcessor's (frames spread by ``linspace`` over the
clip, a whole-clip pixel budget) where the checkpoint names it, as the Hub's Qwen3-VL checkpoints
do; Qwen2VLVideoProcessor's where transformers infers that one from the image processor's type
(a checkpoint without a video processor file). Transformers' Qwen3VLVideoProcessor imports
without torchvision, so its class defaults, its size rule and its processor's timestamps are
transformers' own code.
"""

from __future__ import annotations

import numpy as np

from services.models.qwen2_vl.video_processor import QWEN2_VL_VIDEO_DEFAULTS, Qwen2VLVideoProcessor
from services.models.video import SampledClip, VideoMetadata, VideoOptions, VideoProcessingError


def qwen3_vl_video_defaults() -> dict[str, object]:
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor as HFProcessor

    names = ("image_mean", "image_std", "patch_size", "temporal_patch_size", "merge_size", "min_frames", "max_frames")
    names += ("do_sample_frames", "fps", "num_frames", "cap_pixels_per_frame", "max_video_tokens", "resample")
    names += ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb")
    defaults = {name: getattr(HFProcessor, name) for name in names}
    defaults["image_mean"], defaults["image_std"] = list(defaults["image_mean"]), list(defaults["image_std"])
    defaults["size"] = dict(HFProcessor.size)
    defaults["rescale_factor"] = HFProcessor.rescale_factor
    return defaults


class Qwen3VLVideoProcessor(Qwen2VLVideoProcessor):
    def __init__(self, model_dir, hf_config, rule: str = "Qwen3VLVideoProcessor") -> None:
        self.rule = rule
        self.clip_pixel_budget = rule == "Qwen3VLVideoProcessor"
        super().__init__(model_dir, hf_config, qwen3_vl_video_defaults() if self.clip_pixel_budget else QWEN2_VL_VIDEO_DEFAULTS)

    def sample(self, metadata: VideoMetadata, options: VideoOptions) -> SampledClip:
        """Qwen3VLVideoProcessor.sample_frames, with the request's frame bounds in place of the
        processor's own (as a processor built with them would sample)."""
        if not self.clip_pixel_budget:
            return super().sample(metadata, options)
        settings, total = self._settings, metadata.num_frames
        min_frames = options.min_frames if options.min_frames is not None else settings["min_frames"]
        max_frames = options.max_frames if options.max_frames is not None else settings["max_frames"]
        num_frames = options.num_frames
        if num_frames is None and options.fps is None:
            num_frames = settings["num_frames"]
        fps = options.fps if options.fps is not None else settings["fps"]
        if num_frames is None and fps is not None:
            num_frames = int(total / metadata.fps * fps)
            num_frames = min(max(num_frames, min_frames), max_frames, total)
        if num_frames is None:
            num_frames = min(max(total, min_frames), max_frames)
        if num_frames < self.temporal_patch_size:
            raise VideoProcessingError(f"the video has {total} frame(s); at least {self.temporal_patch_size} are needed")
        indices = np.linspace(0, total - 1, num_frames).round().astype(int)
        return SampledClip(tuple(int(i) for i in indices.tolist()), metadata)

    def _target_size(self, clip: SampledClip, options: VideoOptions) -> tuple[int, int]:
        """transformers' Qwen3-VL rule: the whole clip's pixels within the budget."""
        if not self.clip_pixel_budget:
            return super()._target_size(clip, options)
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

        min_pixels, max_pixels = self._size_bounds(options)
        factor, num_frames = self.patch_size * self.merge_size, len(clip.indices)
        if self._settings["cap_pixels_per_frame"]:
            frame_cap = int(self._settings["max_video_tokens"]) * factor * factor
            max_pixels = max(min(frame_cap, max_pixels // num_frames), int(min_pixels * 1.05)) * num_frames
        try:
            return smart_resize(
                num_frames,
                clip.metadata.height,
                clip.metadata.width,
                temporal_factor=self.temporal_patch_size,
                factor=factor,
                min_pixels=min_pixels,
                max_pixels=max_pixels,
            )
        except ValueError as exc:
            raise VideoProcessingError(str(exc)) from None

    def _placements(self, clip: SampledClip, num_groups: int) -> tuple[None, ...]:
        return (None,) * num_groups  # each group is positioned as an image: its timestamp text separates them

    def _timestamps(self, clip: SampledClip) -> tuple[float, ...]:
        from transformers import Qwen3VLProcessor

        # The processor's own arithmetic (it reads nothing of the instance).
        return tuple(Qwen3VLProcessor._calculate_timestamps(None, list(clip.indices), clip.metadata.fps, self.temporal_patch_size))
