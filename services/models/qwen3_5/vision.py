"""Qwen3.5's vision tower: transformers' own ``Qwen3_5VisionModel`` or ``Qwen3_5MoeVisionModel``
(Qwen3-VL's tower without its DeepStack mergers), loaded and run as the other Qwen towers
(qwen2_vl/vision.py)."""

from __future__ import annotations

import torch

from services.models.family import ModelConfig
from services.models.qwen2_vl.vision import VisionEncoder, load_tower

__all__ = ["VisionEncoder", "build_vision_tower"]


def build_vision_tower(
    config: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device, *, prepack: bool = False
):
    if config.model_type == "qwen3_5_moe":
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeVisionModel as Tower
    else:
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel as Tower
    return load_tower(Tower, config, weights, dtype, device, prepack=prepack)
