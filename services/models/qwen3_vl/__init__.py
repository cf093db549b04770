"""Qwen3-VL: a 16-pixel-patch vision tower with DeepStack levels (transformers' own modules),
Qwen3 text layers with interleaved M-RoPE, and one ``<|image_pad|>`` marker per image expanded at
the token level, as Qwen2-VL.

Shared with Qwen2-VL, because transformers does the same there: the image processor class
(Qwen3VLProcessor uses Qwen2-VL's, with patch size 16), token-level placeholder expansion, and the
M-RoPE position layout of images (Qwen3-VL's get_rope_index differs only for videos, which split
into per-frame grids). What differs is the decoder (q/k norms, interleaved frequencies, DeepStack)
and the tower.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from services.models.family import ModelConfig, ProgressFn
from services.models.qwen2_vl import Qwen2VLFamily
from services.models.qwen2_vl.config import spatial_merge_size
from services.models.qwen3_vl import builtin
from services.models.qwen3_vl.config import read_config
from services.models.qwen3_vl.decoder import TextDecoder
from services.models.qwen3_vl.vision import VisionEncoder, build_vision_tower


class Qwen3VLFamily(Qwen2VLFamily):
    """Qwen2-VL's image processor, prompt layout, positions, pixel check and weight names; its own
    config, decoder, tower and built-ins."""

    name = "qwen3_vl"
    model_types = ("qwen3_vl",)

    def builtins(self) -> Mapping[str, builtin.BuiltinSpec]:
        return builtin.BUILTIN_SPECS

    def write_checkpoint(self, name: str, out: Path, progress: ProgressFn) -> int:
        return builtin.write_checkpoint(builtin.BUILTIN_SPECS[name], out, progress)

    def read_config(self, path: Path) -> ModelConfig:
        return read_config(path)

    def build_decoder(self, config: ModelConfig, weights: dict[str, torch.Tensor]) -> TextDecoder:
        decoder = TextDecoder(config.text)
        decoder.load(weights)
        return decoder

    def build_vision(
        self, config: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device, *, prepack: bool
    ) -> VisionEncoder:
        return VisionEncoder(build_vision_tower(config, weights, dtype, device, prepack=prepack), spatial_merge_size(config))


FAMILY = Qwen3VLFamily()
