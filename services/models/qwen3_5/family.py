"""The qwen3_5 family's tensor side (services/models/family.py's ModelFamily): loaded only by the
roles that run the model; the package's INFO says what the gateway and the registry need."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from services.models.builtins import qwen3_5 as builtin
from services.models.family import ModelConfig, ProgressFn
from services.models.qwen2_vl.config import spatial_merge_size
from services.models.qwen3_5 import INFO
from services.models.qwen3_5.config import read_config
from services.models.qwen3_5.decoder import TextDecoder
from services.models.qwen3_5.moe import fuse_experts
from services.models.qwen3_5.vision import VisionEncoder, build_vision_tower
from services.models.qwen3_vl.family import Qwen3VLFamily


class Qwen35Family(Qwen3VLFamily):
    """Qwen3-VL's processors, prompt layout, positions (videos as timestamped frame groups) and
    weight names; its own config, hybrid decoder, tower and built-ins."""

    name = INFO.name
    model_types = INFO.model_types
    tool_call_parser = INFO.tool_call_parser

    def builtins(self) -> Mapping[str, builtin.BuiltinSpec]:
        return builtin.BUILTIN_SPECS

    def write_checkpoint(self, name: str, out: Path, progress: ProgressFn) -> int:
        return builtin.write_checkpoint(builtin.BUILTIN_SPECS[name], out, progress)

    def read_config(self, path: Path) -> ModelConfig:
        return read_config(path)

    def build_decoder(self, config: ModelConfig, weights: dict[str, torch.Tensor]) -> TextDecoder:
        decoder = TextDecoder(config.text)
        decoder.load(fuse_experts(weights) if config.text.moe is not None else weights)
        return decoder

    def build_vision(
        self, config: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device, *, prepack: bool
    ) -> VisionEncoder:
        return VisionEncoder(build_vision_tower(config, weights, dtype, device, prepack=prepack), spatial_merge_size(config))


FAMILY = Qwen35Family()
