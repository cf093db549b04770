"""Gemma3's vision side, through transformers' own modules (their numerics are the oracle's): the
SigLIP tower on square crops, then the projector (average-pool the patch grid down to
mm_tokens_per_image soft tokens, Gemma RMSNorm, project to the text width). With ``prepack`` on
CPU, the tower's linear layers run on weights prepacked for oneDNN (kernels/cpu_linear.py).

encode(pixel_values, grids) takes one (crops, 3, S, S) tensor per part (one crop each once split)
and returns one (crops * tokens_per_crop, text_hidden) tensor per part, in order.
"""

from __future__ import annotations

import copy
import time

import torch
from torch import nn

from kernels.cpu_linear import pack_linears, packing_available
from services.models.family import ModelConfig


class Gemma3Vision(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        from transformers.models.gemma3.modeling_gemma3 import Gemma3MultiModalProjector
        from transformers.models.siglip.modeling_siglip import SiglipVisionModel

        hf = copy.deepcopy(config.hf)  # building a model records its dtype and attention backend on its config
        self.vision_tower = SiglipVisionModel._from_config(hf.vision_config, dtype=dtype)
        self.multi_modal_projector = Gemma3MultiModalProjector(hf).to(dtype)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        hidden = self.vision_tower(pixel_values=pixel_values).last_hidden_state
        return self.multi_modal_projector(hidden)


def build_vision(
    config: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device, *, prepack: bool = False
) -> Gemma3Vision:
    model = Gemma3Vision(config, dtype)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # SigLIP's position_ids is a non-persistent buffer in some versions and saved in others.
    missing = [name for name in missing if not name.endswith("position_ids")]
    if missing or unexpected:
        raise ValueError(f"vision weight mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model = model.to(device).eval()
    if prepack and device.type == "cpu" and dtype == torch.float32 and packing_available():
        pack_linears(model.vision_tower)
    return model


class VisionEncoder:
    def __init__(self, model: Gemma3Vision) -> None:
        self.model = model
        self.module = model  # weight_group's names: vision_tower.*, multi_modal_projector.*
        self.num_items_encoded = 0
        self.seconds_encoding = 0.0  # the tower's own time, as the family's Protocol counts it

    @torch.inference_mode()
    def encode(self, pixel_values: list[torch.Tensor], grids_thw: list[tuple[int, int, int]]) -> list[torch.Tensor]:
        started = time.perf_counter()
        param = next(self.model.parameters())
        crops = torch.cat(pixel_values).to(device=param.device, dtype=param.dtype)
        embeds = self.model(crops)  # (total crops, tokens per crop, hidden)
        self.num_items_encoded += len(grids_thw)
        self.seconds_encoding += time.perf_counter() - started
        return [part.reshape(-1, part.shape[-1]) for part in torch.split(embeds, [t for t, _, _ in grids_thw])]
