"""What an image will cost before it is decoded: its placeholder tokens from its size alone.

The gateway prices a request's media before admitting it (services/gateway/media_budget.py),
from image headers, and may not load torch, so the families' processors (which do) hand it one
of these plain records, as JSON, over the preprocess node's MediaCost call:

  ResizeCost  Qwen2-VL, Qwen2.5-VL, Qwen3-VL: transformers' smart_resize (sides rounded to
              patch x merge, the area kept within [min_pixels, max_pixels]), then one token per
              merge x merge patches; exact (tests/services/models/test_media_cost.py)
  ViewCost    Gemma3: a fixed number of tokens per view; with Pan-and-Scan, an image wide or tall
              enough to be cropped is priced at its largest number of crops (an upper bound)
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


def cost_model_to_json(model: MediaCostModel) -> str:
    kind = "resize" if isinstance(model, ResizeCost) else "views"
    return json.dumps({"kind": kind, **asdict(model)}, sort_keys=True)


def cost_model_from_json(text: str) -> MediaCostModel:
    fields = json.loads(text)
    return _KINDS[fields.pop("kind")](**fields)
