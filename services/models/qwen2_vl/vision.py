"""The vision tower and merger, run through transformers' own module (not reimplemented: its
numerics are the oracle's). With ``prepack`` on CPU, its linear layers and its patch embedding (a
convolution that is a linear product over each patch) run on weights prepacked for oneDNN
(kernels/cpu_linear.py), the same products summed in another order, faster where MKL runs AVX2
code (docs/benchmarks.md, "oneDNN against MKL").

encode(pixel_values, grid_thw) returns one (num_tokens, text_hidden) tensor per image, in order.
"""

from __future__ import annotations

import copy
import time

import torch

from kernels.cpu_linear import PackedPatchConv, pack_linears, packing_available
from services.models.family import ModelConfig


def build_vision_tower(
    config: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device, *, prepack: bool = False
):
    if config.model_type == "qwen2_5_vl":
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel as Tower
    else:
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel as Tower
    return load_tower(Tower, config, weights, dtype, device, prepack=prepack)


def load_tower(tower_class, config: ModelConfig, weights: dict[str, torch.Tensor], dtype, device: torch.device, *, prepack: bool):
    """Any Qwen-VL generation's tower: transformers' ``tower_class`` from the checkpoint's vision
    config, its weights (none missing, none left over), prepacked where that runs."""
    # A copy: building a model records its dtype and attention backend on the config it is given.
    tower = tower_class._from_config(copy.deepcopy(config.hf.vision_config), dtype=dtype)
    missing, unexpected = tower.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise ValueError(f"vision weight mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    tower = tower.to(device).eval()
    if prepack and device.type == "cpu" and dtype == torch.float32 and packing_available():
        pack_linears(tower)
        tower.patch_embed.proj = PackedPatchConv(tower.patch_embed.proj)
    return tower


class VisionEncoder:
    """A Qwen-VL tower over a batch of images: one embedding tensor per image, of t*h*w /
    merge_area rows. Qwen3-VL's rows carry its DeepStack levels as further columns."""

    def __init__(self, tower, spatial_merge_size: int) -> None:
        self.tower = tower
        self.module = tower  # weight_group names its weights from the tower down
        self.merge_area = spatial_merge_size**2
        self.num_items_encoded = 0
        self.seconds_encoding = 0.0

    @torch.inference_mode()
    def encode(self, pixel_values: list[torch.Tensor], grids_thw: list[tuple[int, int, int]]) -> list[torch.Tensor]:
        started = time.perf_counter()
        param = next(self.tower.parameters())
        pixels = torch.cat(pixel_values).to(device=param.device, dtype=param.dtype)
        out = self.tower(pixels, grid_thw=torch.tensor(grids_thw, dtype=torch.long, device=param.device))
        embeds = out.pooler_output if hasattr(out, "pooler_output") else out
        # Qwen3-VL: the main embedding, then each DeepStack level, side by side.
        rows = torch.cat([embeds, *out.deepstack_features], dim=1) if getattr(out, "deepstack_features", None) else embeds
        sizes = [t * h * w // self.merge_area for t, h, w in grids_thw]
        self.num_items_encoded += len(grids_thw)
        self.seconds_encoding += time.perf_counter() - started
        return list(torch.split(rows, sizes))
