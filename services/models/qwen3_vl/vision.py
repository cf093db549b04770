"""Qwen3-VL's vision tower, run through transformers' own ``Qwen3VLVisionModel`` (not reimplemented:
its numerics are the oracle's): a Conv3d patch embedding (16x16 patches, 2 frames), learned
position embeddings interpolated to each image's grid, ViT blocks with 2-D rotary attention, the
2x2 patch merger, and one DeepStack merger per ``deepstack_visual_indexes`` block.

With ``prepack`` on CPU, its linear layers and its patch embedding (a convolution whose kernel is
its stride: a linear product over each patch; kernels/cpu_linear.py's PackedPatchConv, bias
included) run on weights prepacked for oneDNN, as for Qwen2-VL.

encode(pixel_values, grid_thw) returns one tensor per image of (num_tokens, text_hidden * (1 + L)):
the merger's output, then the L DeepStack levels, side by side (services/models/paged_decoder.py).
"""

from __future__ import annotations

import copy

import torch

from kernels.cpu_linear import PackedPatchConv, pack_linears, packing_available
from services.models.family import ModelConfig


def build_vision_tower(
    config: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device, *, prepack: bool = False
):
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    # A copy: building a model records its dtype and attention backend on the config it is given.
    tower = Qwen3VLVisionModel._from_config(copy.deepcopy(config.hf.vision_config), dtype=dtype)
    missing, unexpected = tower.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise ValueError(f"vision weight mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    tower = tower.to(device).eval()
    if prepack and device.type == "cpu" and dtype == torch.float32 and packing_available():
        pack_linears(tower)
        tower.patch_embed.proj = PackedPatchConv(tower.patch_embed.proj)
    return tower


class VisionEncoder:
    def __init__(self, tower, spatial_merge_size: int) -> None:
        self.tower = tower
        self.merge_area = spatial_merge_size**2
        self.num_items_encoded = 0

    @torch.inference_mode()
    def encode(self, pixel_values: list[torch.Tensor], grids_thw: list[tuple[int, int, int]]) -> list[torch.Tensor]:
        param = next(self.tower.parameters())
        pixels = torch.cat(pixel_values).to(device=param.device, dtype=param.dtype)
        grid = torch.tensor(grids_thw, dtype=torch.long, device=param.device)
        out = self.tower(pixels, grid_thw=grid)
        # One tensor for all images: the main embedding, then each DeepStack level, as columns.
        rows = torch.cat([out.pooler_output, *out.deepstack_features], dim=1)
        sizes = [t * h * w // self.merge_area for t, h, w in grids_thw]
        self.num_items_encoded += len(grids_thw)
        return list(torch.split(rows, sizes))
