"""The qwen3_vl family's tensor side (services/models/family.py's ModelFamily): loaded only by the
roles that run the model; the package's INFO says what the gateway and the registry need."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from services.models.builtins import qwen3_vl as builtin
from services.models.family import ModelConfig, ProgressFn
from services.models.placeholders import Span
from services.models.qwen2_vl.config import spatial_merge_size
from services.models.qwen2_vl.family import Qwen2VLFamily
from services.models.qwen3_vl import INFO
from services.models.qwen3_vl.config import read_config
from services.models.qwen3_vl.decoder import TextDecoder
from services.models.qwen3_vl.video_processor import Qwen3VLVideoProcessor
from services.models.qwen3_vl.vision import VisionEncoder, build_vision_tower
from services.models.video import KNOWN_VIDEO_PROCESSORS, ProcessedVideo, transformers_video_processor


class Qwen3VLFamily(Qwen2VLFamily):
    """Qwen2-VL's image processor, image layout, pixel check and weight names; its own config,
    decoder, tower, built-ins and video layout. Positions are Qwen2-VL's, with each video group
    positioned as an image (its processor gives the groups no placement)."""

    name = INFO.name
    model_types = INFO.model_types
    tool_call_parser = INFO.tool_call_parser

    def builtins(self) -> Mapping[str, builtin.BuiltinSpec]:
        return builtin.BUILTIN_SPECS

    def write_checkpoint(self, name: str, out: Path, progress: ProgressFn) -> int:
        return builtin.write_checkpoint(builtin.BUILTIN_SPECS[name], out, progress)

    def read_config(self, path: Path) -> ModelConfig:
        return read_config(path)

    def video_processor(self, path: Path, config: ModelConfig, image_processor) -> Qwen3VLVideoProcessor:
        rule = transformers_video_processor(path, default="Qwen3VLVideoProcessor")
        if rule not in KNOWN_VIDEO_PROCESSORS:
            raise ValueError(f"{path}: its video processor {rule} is not one Tessera follows ({', '.join(KNOWN_VIDEO_PROCESSORS)})")
        return Qwen3VLVideoProcessor(path, config.hf, rule)

    def _video_spans(self, config: ModelConfig, tokenizer, video: ProcessedVideo) -> list[Span]:
        """Qwen3-VL: each group is written ``<t seconds><|vision_start|>`` pads ``<|vision_end|>``
        (transformers' processor expands the bare ``<|video_pad|>``, inside the template's own
        vision_start / vision_end)."""
        start, end = int(config.hf.vision_start_token_id), int(config.hf.vision_end_token_id)
        return [
            Span(group.num_tokens, before=(*tokenizer.encode(f"<{seconds:.1f} seconds>", add_special_tokens=False), start), after=(end,))
            for group, seconds in zip(video.groups, video.timestamps)
        ]

    def build_decoder(self, config: ModelConfig, weights: dict[str, torch.Tensor]) -> TextDecoder:
        decoder = TextDecoder(config.text)
        decoder.load(weights)
        return decoder

    def build_vision(
        self, config: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device, *, prepack: bool
    ) -> VisionEncoder:
        return VisionEncoder(build_vision_tower(config, weights, dtype, device, prepack=prepack), spatial_merge_size(config))


FAMILY = Qwen3VLFamily()
