"""Gemma3 image processing without torchvision: transformers' PIL-backend image processor (resize
to the tower's square input, rescale, normalise), with optional Pan-and-Scan.

Pan-and-Scan (off by default, as in transformers): a wide or tall image also yields up to
``max_num_crops`` crops, each resized like the full view. The processed image holds the full view
first, then the crops, as (1 + crops, 3, S, S); its grid is (1 + crops, side, side) with side**2
soft tokens per view, and ``split`` makes each view its own placeholder span.
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from services.models.family import ProcessedImage
from services.models.hf_config import image_call_kwargs
from services.models.media_cost import ViewCost

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
        self.num_processed = 0

    def _setting(self, name: str) -> object:
        return self._kwargs[name] if name in self._kwargs else getattr(self._hf, name)

    @property
    def kwargs_for_hash(self) -> dict[str, object]:
        size = self._setting("size")
        settings: dict[str, object] = {
            "size": [int(size["height"]), int(size["width"])],
            "resample": int(self._setting("resample")),
            "rescale_factor": float(self._setting("rescale_factor")),
            "image_mean": [float(x) for x in self._setting("image_mean")],
            "image_std": [float(x) for x in self._setting("image_std")],
            "do_convert_rgb": bool(self._setting("do_convert_rgb")),
            "tokens_per_side": self.tokens_per_side,
            "do_pan_and_scan": bool(self._setting("do_pan_and_scan")),
        }
        if settings["do_pan_and_scan"]:  # the crop settings matter only when crops are made
            settings.update({name: float(self._setting(name)) for name in PAN_AND_SCAN_SETTINGS})
        return settings

    def process(self, image: Image.Image) -> ProcessedImage:
        out = self._hf(images=[image], return_tensors="pt", **self._kwargs)
        self.num_processed += 1
        views = out["pixel_values"].contiguous()
        grid = (int(views.shape[0]), self.tokens_per_side, self.tokens_per_side)
        return ProcessedImage(pixel_values=views, grid_thw=grid, num_tokens=self.num_tokens(grid))

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
