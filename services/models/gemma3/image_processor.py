"""Gemma3 image processing as transformers' default (torchvision) Gemma3ImageProcessor does it:
resize to the tower's square input, rescale, normalise (services/models/tensor_pixels.py's steps,
torch alone), with optional Pan-and-Scan. The settings are read by transformers' own class, whose
defaults the torchvision class shares.

Pan-and-Scan (off by default, as in transformers): a wide or tall image also yields up to
``max_num_crops`` crops, each resized like the full view. The processed image holds the full view
first, then the crops, as (1 + crops, 3, S, S); its grid is (1 + crops, side, side) with side**2
soft tokens per view, and ``split`` makes each view its own placeholder span.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import torch
from PIL import Image

from services.models.family import ProcessedImage
from services.models.hf_config import image_call_kwargs
from services.models.media_cost import ViewCost
from services.models.tensor_pixels import PixelSettings, image_tensor, rescale_and_normalize, resize, stacked

PAN_AND_SCAN_SETTINGS = ("pan_and_scan_min_crop_size", "pan_and_scan_max_num_crops", "pan_and_scan_min_ratio_to_activate")


class Gemma3ImageProcessor:
    def __init__(self, model_dir: Path, *, tokens_per_side: int, do_pan_and_scan: bool | None = None) -> None:
        from transformers import Gemma3Processor
        from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

        self._hf = Gemma3ImageProcessorPil.from_pretrained(str(model_dir))
        self.tokens_per_side = tokens_per_side
        # As Gemma3Processor calls it: its defaults (RGB conversion on, Pan-and-Scan off, the crop
        # settings) win over the file's; --pan-and-scan is the caller's do_pan_and_scan.
        self._kwargs = image_call_kwargs(self._hf, Gemma3Processor)
        if do_pan_and_scan is not None:
            self._kwargs["do_pan_and_scan"] = do_pan_and_scan
        self.settings = PixelSettings.of(self._setting)
        self.num_processed = 0

    def _setting(self, name: str) -> object:
        return self._kwargs[name] if name in self._kwargs else getattr(self._hf, name)

    @property
    def kwargs_for_hash(self) -> dict[str, object]:
        size = self._setting("size")
        settings: dict[str, object] = {
            "size": [int(size["height"]), int(size["width"])],
            "tokens_per_side": self.tokens_per_side,
            "do_pan_and_scan": bool(self._setting("do_pan_and_scan")),
            **self.settings.for_hash(),
        }
        if settings["do_pan_and_scan"]:  # the crop settings matter only when crops are made
            settings.update({name: float(self._setting(name)) for name in PAN_AND_SCAN_SETTINGS})
        return settings

    def process(self, image: Image.Image) -> ProcessedImage:
        """The full view first, then any Pan-and-Scan crops, each resized to the tower's input."""
        whole = stacked([image_tensor(image, convert_rgb=self.settings.do_convert_rgb)])
        pan_and_scan = bool(self._setting("do_pan_and_scan"))
        views = [whole, *self._crops(whole)] if pan_and_scan else [whole]
        if self.settings.do_resize or pan_and_scan:  # transformers resizes views whatever do_resize says
            size = self._setting("size")
            views = [resize(view, int(size["height"]), int(size["width"]), self.settings.resample) for view in views]
        pixels = rescale_and_normalize(torch.cat(views).contiguous(), self.settings)
        self.num_processed += 1
        grid = (int(pixels.shape[0]), self.tokens_per_side, self.tokens_per_side)
        return ProcessedImage(pixel_values=pixels, grid_thw=grid, num_tokens=self.num_tokens(grid))

    def _crops(self, image: torch.Tensor) -> list[torch.Tensor]:
        """Gemma3's Pan-and-Scan (transformers' pan_and_scan_batched): an image wide or tall enough
        is cut into 2..max crops along its long side, none narrower than the minimum crop size."""
        height, width = image.shape[-2:]
        min_crop = int(self._setting("pan_and_scan_min_crop_size"))
        max_crops, min_ratio = int(self._setting("pan_and_scan_max_num_crops")), float(self._setting("pan_and_scan_min_ratio_to_activate"))
        long, short = max(width, height), min(width, height)
        if long / short < min_ratio:
            return []
        num = min(max_crops, max(2, min(math.floor(long / min_crop), math.floor(long / short + 0.5))))
        num_w, num_h = (num, 1) if width >= height else (1, num)
        crop_w, crop_h = math.ceil(width / num_w), math.ceil(height / num_h)
        if min(crop_w, crop_h) < min_crop:
            return []
        return [
            image[..., top : top + crop_h, left : left + crop_w]
            for top, left in itertools.product(range(0, crop_h * num_h, crop_h), range(0, crop_w * num_w, crop_w))
        ]

    def cost_model(self) -> ViewCost:
        if not self._setting("do_pan_and_scan"):
            return ViewCost(self.tokens_per_side**2)
        crops, ratio = int(self._setting("pan_and_scan_max_num_crops")), float(self._setting("pan_and_scan_min_ratio_to_activate"))
        return ViewCost(self.tokens_per_side**2, crops, ratio)

    def num_tokens(self, grid_thw: tuple[int, int, int]) -> int:
        views, h, w = grid_thw
        return views * h * w

    def split(self, image: ProcessedImage) -> list[ProcessedImage]:
        views, h, w = image.grid_thw
        if views == 1:
            return [image]
        pixels = image.pixel_values
        return [ProcessedImage(None if pixels is None else pixels[k : k + 1], (1, h, w), h * w) for k in range(views)]
