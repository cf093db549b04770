"""Qwen2-VL image processing as transformers' default (torchvision) Qwen2VLImageProcessor does it:
resize to multiples of patch x merge within [min_pixels, max_pixels] (smart_resize), rescale,
normalize, patchify. The pixel steps are services/models/tensor_pixels.py's (torch alone); the
settings are read by transformers' own class, whose defaults the torchvision class shares."""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image

from services.models.family import ProcessedImage
from services.models.hf_config import image_call_kwargs
from services.models.media_cost import ResizeCost
from services.models.tensor_pixels import PixelSettings, image_tensor, rescale_and_normalize, resize, stacked


def patch_rows(images: torch.Tensor, patch_size: int, merge_size: int, temporal_patch_size: int) -> tuple[torch.Tensor, int, int]:
    """(N, C, H, W) normalized images as Qwen's flat patch rows, (N, grid_h * grid_w, C * T * p * p),
    each image repeated in its T temporal slots; patches ordered merge window by merge window."""
    num, channels, height, width = images.shape
    grid_h, grid_w = height // patch_size, width // patch_size
    patches = images.reshape(num, channels, grid_h // merge_size, merge_size, patch_size, grid_w // merge_size, merge_size, patch_size)
    # (N, grid_h/m, grid_w/m, m, m, C, p, p): merge windows in raster order, then the patches in each
    patches = patches.permute(0, 2, 5, 3, 6, 1, 4, 7).unsqueeze(6)
    patches = patches.expand(-1, -1, -1, -1, -1, -1, temporal_patch_size, -1, -1)
    return patches.reshape(num, grid_h * grid_w, channels * temporal_patch_size * patch_size * patch_size), grid_h, grid_w


class Qwen2VLImageProcessor:
    def __init__(self, model_dir: Path, *, min_pixels: int | None = None, max_pixels: int | None = None) -> None:
        from transformers import Qwen2VLProcessor
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        hf = Qwen2VLImageProcessorPil.from_pretrained(str(model_dir))  # the file over the class defaults
        # As the family's processor calls it (Qwen2-VL's and Qwen3-VL's set no image defaults of
        # their own; a null field takes the class default).
        kwargs = image_call_kwargs(hf, Qwen2VLProcessor)
        self.settings = PixelSettings.of(lambda name: kwargs[name] if name in kwargs else getattr(hf, name))
        size = dict(hf.size)
        if min_pixels is not None:
            size["shortest_edge"] = min_pixels
        if max_pixels is not None:
            size["longest_edge"] = max_pixels
        self.min_pixels, self.max_pixels = int(size["shortest_edge"]), int(size["longest_edge"])
        self.merge_size: int = hf.merge_size
        self.patch_size: int = hf.patch_size
        self.temporal_patch_size: int = hf.temporal_patch_size
        self.num_processed = 0

    @property
    def kwargs_for_hash(self) -> dict[str, object]:
        """Every setting that changes the processed output; part of each image's mm_hash."""
        return {
            "min_pixels": self.min_pixels,
            "max_pixels": self.max_pixels,
            "patch_size": self.patch_size,
            "temporal_patch_size": self.temporal_patch_size,
            "merge_size": self.merge_size,
            **self.settings.for_hash(),
        }

    def process(self, image: Image.Image) -> ProcessedImage:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        batch = stacked([image_tensor(image, convert_rgb=self.settings.do_convert_rgb)])
        if self.settings.do_resize:
            factor = self.patch_size * self.merge_size
            height, width = smart_resize(*batch.shape[-2:], factor=factor, min_pixels=self.min_pixels, max_pixels=self.max_pixels)
            batch = resize(batch, height, width, self.settings.resample)
        rows, grid_h, grid_w = patch_rows(
            rescale_and_normalize(batch, self.settings), self.patch_size, self.merge_size, self.temporal_patch_size
        )
        self.num_processed += 1
        grid = (1, grid_h, grid_w)
        return ProcessedImage(pixel_values=rows[0].contiguous(), grid_thw=grid, num_tokens=self.num_tokens(grid))

    def cost_model(self) -> ResizeCost:
        return ResizeCost(self.patch_size, self.merge_size, self.min_pixels, self.max_pixels)

    def num_tokens(self, grid_thw: tuple[int, int, int]) -> int:
        """t*h*w patches, merged merge_size x merge_size into one token each."""
        t, h, w = grid_thw
        return t * h * w // self.merge_size**2

    def split(self, image: ProcessedImage) -> list[ProcessedImage]:
        return [image]
