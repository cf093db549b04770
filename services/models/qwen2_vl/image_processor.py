"""Qwen2-VL image processing without torchvision: transformers' PIL-backend image processor
(resize to multiples of 28 within [min_pixels, max_pixels], rescale, normalize, patchify)."""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image

from services.models.family import ProcessedImage
from services.models.hf_config import image_call_kwargs
from services.models.media_cost import ResizeCost


class Qwen2VLImageProcessor:
    def __init__(self, model_dir: Path, *, min_pixels: int | None = None, max_pixels: int | None = None) -> None:
        from transformers import Qwen2VLProcessor
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        self._hf = Qwen2VLImageProcessorPil.from_pretrained(str(model_dir))
        # As the family's processor calls it (Qwen2-VL's and Qwen3-VL's set no image defaults of
        # their own; a null field takes the class default).
        self._kwargs = image_call_kwargs(self._hf, Qwen2VLProcessor)
        size = dict(self._hf.size)
        if min_pixels is not None:
            size["shortest_edge"] = min_pixels
        if max_pixels is not None:
            size["longest_edge"] = max_pixels
        self._size = size
        self.merge_size: int = self._hf.merge_size
        self.patch_size: int = self._hf.patch_size
        self.temporal_patch_size: int = self._hf.temporal_patch_size
        self.num_processed = 0

    @property
    def kwargs_for_hash(self) -> dict[str, object]:
        """Every setting that changes the processed output; part of each image's mm_hash."""
        return {
            "min_pixels": int(self._size["shortest_edge"]),
            "max_pixels": int(self._size["longest_edge"]),
            "patch_size": self.patch_size,
            "temporal_patch_size": self.temporal_patch_size,
            "merge_size": self.merge_size,
            "image_mean": [float(x) for x in self._hf.image_mean],
            "image_std": [float(x) for x in self._hf.image_std],
            "do_convert_rgb": bool(self._kwargs.get("do_convert_rgb", self._hf.do_convert_rgb)),
        }

    def process(self, image: Image.Image) -> ProcessedImage:
        out = self._hf(images=[image], return_tensors="pt", **{**self._kwargs, "size": self._size})
        self.num_processed += 1
        grid = tuple(int(x) for x in out["image_grid_thw"][0].tolist())
        return ProcessedImage(pixel_values=out["pixel_values"].contiguous(), grid_thw=grid, num_tokens=self.num_tokens(grid))

    def rows_of_resized(self, frames: list[Image.Image], *, image_mean, image_std, rescale_factor: float) -> list[torch.Tensor]:
        """Frames already at their target size through this processor, in one call, with its
        resize off (a video's frames: services/models/video.py): each frame's patch rows, the
        frame in every temporal slot."""
        kwargs = {**self._kwargs, "do_resize": False, "image_mean": image_mean, "image_std": image_std, "rescale_factor": rescale_factor}
        rows = self._hf(images=frames, return_tensors="pt", **kwargs)["pixel_values"]
        return list(rows.chunk(len(frames)))

    def cost_model(self) -> ResizeCost:
        return ResizeCost(self.patch_size, self.merge_size, int(self._size["shortest_edge"]), int(self._size["longest_edge"]))

    def num_tokens(self, grid_thw: tuple[int, int, int]) -> int:
        """t*h*w patches, merged merge_size x merge_size into one token each."""
        t, h, w = grid_thw
        return t * h * w // self.merge_size**2

    def split(self, image: ProcessedImage) -> list[ProcessedImage]:
        return [image]
