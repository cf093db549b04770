"""Pixels as transformers' default (torchvision) image and video processors compute them, with
torch alone.

Why: with torchvision installed, which is how users and vLLM run transformers, ``AutoProcessor``
builds the torchvision processors, and transformers' video processors always use torchvision. Their
resize differs from PIL's by up to a third of the normalized range on resized images, so pixels
made with PIL are not the reference users compare with. torchvision's registry build needs the
registry's CUDA torch and does not import beside the CPU wheel the project installs; its tensor
resize on a CPU is torch's own ``interpolate`` (docs/architecture.md, "Reference pixels"), so the
steps are done here with torch, in the order and dtypes transformers' TorchvisionBackend uses:

  image_tensor  the PIL image as transformers converts it (transparency composited onto white,
                then RGB), uint8, channels first, contiguous
  resize        torchvision's ``resize`` of a uint8 batch: ``interpolate`` with align_corners off
                and antialias on, on uint8 where torchvision resizes uint8 natively on a CPU
                (bicubic always; bilinear with AVX2/AVX512), else through float32, clamped for
                bicubic and rounded; an unchanged size is returned as it is
  rescale_and_normalize  transformers' fused rescale and normalize: the mean and std as
                float32 tensors divided by the rescale factor, subtracted and divided in float32

tests/services/models/test_reference_pixels.py holds these equal to transformers' own processors
running with real torchvision (tests/reference_processors.py), bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
from PIL import Image

PIXEL_BACKEND = "torchvision-equal/1"  # in every processed item's mm_hash: pixels of another path are never reused

# PIL's resampling filters (the checkpoints' ``resample``) as torch's interpolate modes.
_MODES = {0: "nearest", 2: "bilinear", 3: "bicubic"}


def image_tensor(image: Image.Image, *, convert_rgb: bool) -> torch.Tensor:
    """(C, H, W) uint8, as TorchvisionBackend.process_image makes it from a PIL image."""
    if convert_rgb:
        from transformers.image_transforms import convert_to_rgb

        array = convert_to_rgb(image, return_numpy=True)
    else:
        array = np.array(image)
    tensor = torch.from_numpy(array)
    if tensor.ndim == 2:
        return tensor.unsqueeze(0).contiguous()
    return tensor.permute(2, 0, 1).contiguous()


def stacked(images: Sequence[torch.Tensor]) -> torch.Tensor:
    """Same-shaped images as one batch, as transformers groups them."""
    return images[0].unsqueeze(0) if len(images) == 1 else torch.stack(list(images), dim=0)


def resize(images: torch.Tensor, height: int, width: int, resample: int) -> torch.Tensor:
    """A uint8 batch (N, C, H, W) resized to (height, width) as torchvision's tensor resize does."""
    if resample not in _MODES:
        raise ValueError(f"resample {resample} has no tensor resize here (nearest 0, bilinear 2, bicubic 3)")
    if tuple(images.shape[-2:]) == (height, width):
        return images
    mode = _MODES[resample]
    if mode == "nearest":
        return torch.nn.functional.interpolate(images, size=[height, width], mode="nearest")
    native = mode == "bicubic" or torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    if images.dtype == torch.uint8 and native and images.device.type == "cpu":
        return torch.nn.functional.interpolate(images, size=[height, width], mode=mode, align_corners=False, antialias=True)
    dtype = images.dtype
    out = torch.nn.functional.interpolate(images.to(torch.float32), size=[height, width], mode=mode, align_corners=False, antialias=True)
    if dtype == torch.uint8:
        if mode == "bicubic":
            out = out.clamp_(min=0, max=255)
        out = out.round_().to(dtype)
    return out


def rescale_and_normalize(images: torch.Tensor, settings: PixelSettings) -> torch.Tensor:
    """float32 pixels: rescaled and normalized fused, as transformers fuses them when it does
    both; either alone as it does it alone."""
    if settings.do_normalize:
        mean, std = settings.image_mean, settings.image_std
        if settings.do_rescale:
            mean = torch.tensor(list(mean), device=images.device) * (1.0 / settings.rescale_factor)
            std = torch.tensor(list(std), device=images.device) * (1.0 / settings.rescale_factor)
        mean = torch.as_tensor(mean, dtype=torch.float32, device=images.device).view(-1, 1, 1)
        std = torch.as_tensor(std, dtype=torch.float32, device=images.device).view(-1, 1, 1)
        return images.to(torch.float32).sub_(mean).div_(std)
    if settings.do_rescale:
        return images * settings.rescale_factor
    return images.to(torch.float32)


@dataclass(frozen=True, slots=True)
class PixelSettings:
    """The settings these steps take, as the checkpoint's processor holds them."""

    do_convert_rgb: bool
    do_resize: bool
    resample: int
    do_rescale: bool
    rescale_factor: float
    do_normalize: bool
    image_mean: tuple[float, ...]
    image_std: tuple[float, ...]

    @classmethod
    def of(cls, setting: Callable[[str], object]) -> PixelSettings:
        """From ``setting(name)``: the value a transformers processor call would use."""
        return cls(
            bool(setting("do_convert_rgb")),
            bool(setting("do_resize")),
            int(setting("resample")),
            bool(setting("do_rescale")),
            float(setting("rescale_factor")),
            bool(setting("do_normalize")),
            tuple(float(x) for x in setting("image_mean")),
            tuple(float(x) for x in setting("image_std")),
        )

    def for_hash(self) -> dict[str, object]:
        """What enters an item's mm_hash: every setting, and the pixel path's own name."""
        return {"pixels": PIXEL_BACKEND, **asdict(self)}
