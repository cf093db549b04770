"""Qwen3-VL's vision tower, run through transformers' own ``Qwen3VLVisionModel`` (not reimplemented:
its numerics are the oracle's): a Conv3d patch embedding (16x16 patches, 2 frames), learned
position embeddings interpolated to each image's grid, ViT blocks with 2-D rotary attention, the
2x2 patch merger, and one DeepStack merger per ``deepstack_visual_indexes`` block.

With ``prepack`` on CPU, its linear layers and its patch embedding (a convolution whose kernel is
its stride: a linear product over each patch; kernels/cpu_linear.py's PackedPatchConv, bias
included) run on weights prepacked for oneDNN, as for Qwen2-VL.

encode(pixel_values, grid_thw) returns one tensor per image of (num_tokens, text_hidden * (1 + L)):
the merger's output, then the L DeepStack levels, side by side (services/models/paged_decoder.py).
The loading and the encoder are Qwen2-VL's (qwen2_vl/vision.py); only the tower class differs.
"""

from __future__ import annotations

import torch

from services.models.family import ModelConfig
from services.models.qwen2_vl.vision import VisionEncoder, load_tower

__all__ = ["VisionEncoder", "build_vision_tower"]


def build_vision_tower(
    config: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device, *, prepack: bool = False
):
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    return load_tower(Qwen3VLVisionModel, config, weights, dtype, device, prepack=prepack)
