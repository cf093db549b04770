"""What an image will cost before it is decoded: its placeholder tokens from its size alone.

The gateway prices a request's media before admitting it (services/gateway/frontend/media_budget.py),
from image headers, and may not load torch, so the families' processors (which do) hand it one
of these plain records, as JSON, over the preprocess node's MediaCost call:

  ResizeCost  Qwen2-VL, Qwen2.5-VL, Qwen3-VL: transformers' smart_resize (sides rounded to
              patch x merge, the area kept within [min_pixels, max_pixels]), then one token per
              merge x merge patches; exact (tests/services/models/test_media_cost.py)
  ViewCost    Gemma3: a fixed number of tokens per view; with Pan-and-Scan, an image wide or tall
              enough to be cropped is priced at its largest number of crops (an upper bound)
  ClipCost    the Qwen families' video: the frames the family's sampler takes from a clip of that
              length and frame rate (rounded up to whole temporal groups), each group priced as
              one frame through the video's resize rule; an upper bound for Qwen3-VL, whose
              sampler and clip-wide pixel budget it follows closely
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class ResizeCost:
    patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int

    def image_tokens(self, width: int, height: int) -> int:
        factor = self.patch_size * self.merge_size
        h_bar, w_bar = self._resized(height, width, factor)
        return (h_bar // self.patch_size) * (w_bar // self.patch_size) // self.merge_size**2

    @property
    def max_image_tokens(self) -> int:
        return self.max_pixels // (self.patch_size * self.merge_size) ** 2

    def _resized(self, height: int, width: int, factor: int) -> tuple[int, int]:
        # transformers' smart_resize (Qwen2-VL's image processor), which cannot be imported here
        # without torch.
        h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
        if h_bar * w_bar > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            return max(factor, math.floor(height / beta / factor) * factor), max(factor, math.floor(width / beta / factor) * factor)
        if h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            return math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
        return h_bar, w_bar


@dataclass(frozen=True, slots=True)
class ViewCost:
    tokens_per_view: int
    max_num_crops: int = 0  # 0: Pan-and-Scan off
    min_ratio_to_activate: float = 0.0

    def image_tokens(self, width: int, height: int) -> int:
        ratio = max(width, height) / max(1, min(width, height))
        num_crops = self.max_num_crops if self.max_num_crops and ratio >= self.min_ratio_to_activate else 0
        return (1 + num_crops) * self.tokens_per_view

    @property
    def max_image_tokens(self) -> int:
        return (1 + self.max_num_crops) * self.tokens_per_view


MediaCostModel = ResizeCost | ViewCost
_KINDS = {"resize": ResizeCost, "views": ViewCost}

SERVING_FPS = 2.0  # the frames sampled per second where neither request nor checkpoint names a rate


@dataclass(frozen=True, slots=True)
class ClipCost:
    """The deployment's video settings (the checkpoint's under ``--mm-processor-kwargs``)."""

    patch_size: int
    merge_size: int
    temporal_patch_size: int
    fps: float | None
    num_frames: int | None
    min_frames: int
    max_frames: int
    min_pixels: int
    max_pixels: int
    clip_pixel_budget: bool = False  # Qwen3-VL: max_pixels bounds the whole clip, not each frame

    def clip_tokens(self, num_frames: int, native_fps: float, width: int, height: int, request: dict[str, float]) -> int:
        """A clip's tokens; ``request``: the request's video settings (fps, num_frames, min_frames,
        max_frames, min_pixels, max_pixels), over these as vLLM merges them."""
        frames = max(1.0, self._num_sampled(num_frames, native_fps, request))
        min_pixels = int(request.get("min_pixels", self.min_pixels))
        max_pixels = int(request.get("max_pixels", self.max_pixels))
        if self.clip_pixel_budget:  # the bounds are the clip's: a frame's share, by the frames sampled
            # (at least a pixel each: a price, never a division by zero)
            min_pixels, max_pixels = int(min_pixels // frames), max(1, int(max_pixels // frames))
        frame = ResizeCost(self.patch_size, self.merge_size, min_pixels, max_pixels)  # max first, as transformers checks it
        return math.ceil(frames / self.temporal_patch_size) * frame.image_tokens(width, height)

    def _num_sampled(self, total: int, native_fps: float, request: dict[str, float]) -> float:
        """The frames the sampler takes, before rounding to whole groups."""
        fixed = request.get("num_frames", self.num_frames if "fps" not in request else None)
        if fixed is not None:
            return fixed
        fps = request.get("fps", self.fps if "num_frames" not in request else None) or SERVING_FPS
        min_frames, max_frames = request.get("min_frames", self.min_frames), request.get("max_frames", self.max_frames)
        return min(max(total / max(native_fps, 1e-6) * fps, min_frames), max_frames, max(total, self.temporal_patch_size))


@dataclass(frozen=True, slots=True)
class MediaCosts:
    """What the gateway prices media by: the image rule, and the video rule where the family
    takes video."""

    image: MediaCostModel
    video: ClipCost | None = None


def media_costs_to_json(costs: MediaCosts) -> str:
    video = asdict(costs.video) if costs.video is not None else None
    return json.dumps({"image": json.loads(cost_model_to_json(costs.image)), "video": video}, sort_keys=True)


def media_costs_from_json(text: str) -> MediaCosts:
    fields = json.loads(text)
    video = ClipCost(**fields["video"]) if fields.get("video") else None
    return MediaCosts(cost_model_from_json(json.dumps(fields["image"])), video)


def cost_model_to_json(model: MediaCostModel) -> str:
    kind = "resize" if isinstance(model, ResizeCost) else "views"
    return json.dumps({"kind": kind, **asdict(model)}, sort_keys=True)


def cost_model_from_json(text: str) -> MediaCostModel:
    fields = json.loads(text)
    return _KINDS[fields.pop("kind")](**fields)
