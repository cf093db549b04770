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

# Gemma3Processor's defaults for the Pan-and-Scan settings (its preprocessor_config leaves them null).
PAN_AND_SCAN_DEFAULTS = {"pan_and_scan_min_crop_size": 256, "pan_and_scan_max_num_crops": 4, "pan_and_scan_min_ratio_to_activate": 1.2}


class Gemma3ImageProcessor:
    def __init__(self, model_dir: Path, *, tokens_per_side: int, do_pan_and_scan: bool | None = None) -> None:
        from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

        self._hf = Gemma3ImageProcessorPil.from_pretrained(str(model_dir))
        self.tokens_per_side = tokens_per_side
        enabled = bool(self._hf.do_pan_and_scan) if do_pan_and_scan is None else do_pan_and_scan
        self._kwargs: dict[str, object] = {"do_pan_and_scan": enabled}
        if enabled:
            for name, default in PAN_AND_SCAN_DEFAULTS.items():
                value = getattr(self._hf, name, None)
                self._kwargs[name] = default if value is None else value
        self.num_processed = 0

    @property
    def kwargs_for_hash(self) -> dict[str, object]:
        size = self._hf.size
        return {
            "size": [int(size["height"]), int(size["width"])],
            "resample": int(self._hf.resample),
            "rescale_factor": float(self._hf.rescale_factor),
            "image_mean": [float(x) for x in self._hf.image_mean],
            "image_std": [float(x) for x in self._hf.image_std],
            "tokens_per_side": self.tokens_per_side,
            **{name: value if isinstance(value, bool) else float(value) for name, value in self._kwargs.items()},
        }

    def process(self, image: Image.Image) -> ProcessedImage:
        out = self._hf(images=[image], return_tensors="pt", **self._kwargs)
        self.num_processed += 1
        views = out["pixel_values"].contiguous()
        grid = (int(views.shape[0]), self.tokens_per_side, self.tokens_per_side)
        return ProcessedImage(pixel_values=views, grid_thw=grid, num_tokens=self.num_tokens(grid))

    def num_tokens(self, grid_thw: tuple[int, int, int]) -> int:
        views, h, w = grid_thw
        return views * h * w

    def split(self, image: ProcessedImage) -> list[ProcessedImage]:
        views, h, w = image.grid_thw
        if views == 1:
            return [image]
        pixels = image.pixel_values
        return [ProcessedImage(None if pixels is None else pixels[k : k + 1], (1, h, w), h * w) for k in range(views)]
