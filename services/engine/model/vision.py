"""The vision tower and merger, run through transformers' own module as is (not reimplemented:
its numerics are the oracle's).

encode(pixel_values, grid_thw) returns one (num_tokens, text_hidden) tensor per image, in order.
"""

from __future__ import annotations

import torch

from services.engine.model.checkpoint import CheckpointConfig


def build_vision_tower(config: CheckpointConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device):
    if config.model_type == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel as Tower

        vision_config = Qwen2_5_VLConfig(**config.raw).vision_config
    else:
        from transformers import Qwen2VLConfig
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel as Tower

        vision_config = Qwen2VLConfig(**config.raw).vision_config
    tower = Tower._from_config(vision_config, dtype=dtype)
    missing, unexpected = tower.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise ValueError(f"vision weight mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return tower.to(device).eval()


class VisionEncoder:
    def __init__(self, tower, spatial_merge_size: int) -> None:
        self.tower = tower
        self.merge_area = spatial_merge_size**2
        self.num_items_encoded = 0

    @torch.inference_mode()
    def encode(self, pixel_values: list[torch.Tensor], grids_thw: list[tuple[int, int, int]]) -> list[torch.Tensor]:
        device, dtype = next(self.tower.parameters()).device, next(self.tower.parameters()).dtype
        pixels = torch.cat(pixel_values).to(device=device, dtype=dtype)
        grid = torch.tensor(grids_thw, dtype=torch.long, device=device)
        out = self.tower(pixels, grid_thw=grid)
        embeds = out.pooler_output if hasattr(out, "pooler_output") else out
        sizes = [t * h * w // self.merge_area for t, h, w in grids_thw]
        self.num_items_encoded += len(grids_thw)
        return list(torch.split(embeds, sizes))
