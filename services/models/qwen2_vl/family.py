"""The qwen2_vl family's tensor side (services/models/family.py's ModelFamily): loaded only by the
roles that run the model; the package's INFO says what the gateway and the registry need."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from services.models.builtins import qwen2_vl as builtin
from services.models.family import ImageOptions, ModelConfig, ProcessedImage, ProgressFn
from services.models.placeholders import Span, expand_markers
from services.models.qwen2_vl import INFO
from services.models.qwen2_vl.config import read_config, spatial_merge_size, weight_group
from services.models.qwen2_vl.decoder import TextDecoder
from services.models.qwen2_vl.image_processor import Qwen2VLImageProcessor
from services.models.qwen2_vl.mrope import mrope_positions
from services.models.qwen2_vl.video_processor import Qwen2VLVideoProcessor
from services.models.qwen2_vl.vision import VisionEncoder, build_vision_tower
from services.models.video import ProcessedVideo
from shared.types import GroupPlacement, PlaceholderRange


class Qwen2VLFamily:
    name = INFO.name
    model_types = INFO.model_types
    bidirectional_images = False
    tool_call_parser = INFO.tool_call_parser

    def builtins(self) -> Mapping[str, builtin.BuiltinSpec]:
        return builtin.BUILTIN_SPECS

    def write_checkpoint(self, name: str, out: Path, progress: ProgressFn) -> int:
        return builtin.write_checkpoint(builtin.BUILTIN_SPECS[name], out, progress)

    def read_config(self, path: Path) -> ModelConfig:
        return read_config(path)

    def weight_group(self, name: str) -> tuple[str, str] | None:
        return weight_group(name)

    def image_processor(self, path: Path, options: ImageOptions) -> Qwen2VLImageProcessor:
        return Qwen2VLImageProcessor(path, min_pixels=options.min_pixels, max_pixels=options.max_pixels)

    def video_processor(self, path: Path, config: ModelConfig, image_processor: Qwen2VLImageProcessor) -> Qwen2VLVideoProcessor:
        return Qwen2VLVideoProcessor(path, config.hf)

    def expand_prompt(
        self,
        config: ModelConfig,
        tokenizer,
        prompt: str | Sequence[int],
        parts_per_image: Sequence[Sequence[ProcessedImage]],
        videos: Sequence[ProcessedVideo] = (),
    ) -> tuple[list[int], list[PlaceholderRange]]:
        token_ids = tokenizer.encode(prompt, add_special_tokens=False) if isinstance(prompt, str) else list(prompt)
        images = [[Span(part.num_tokens)] for parts in parts_per_image for part in parts]
        marker_to_items = {config.image_token_id: ("image", images)}
        video_token_id = int(config.hf.video_token_id)
        marker_to_items[video_token_id] = ("video", [self._video_spans(config, tokenizer, video) for video in videos])
        expanded, ranges = expand_markers(token_ids, marker_to_items)
        return expanded, ranges[config.image_token_id] + ranges[video_token_id]

    def _video_spans(self, config: ModelConfig, tokenizer, video: ProcessedVideo) -> list[Span]:
        """Qwen2-VL: a video's groups are one run of ``<|video_pad|>``, group after group."""
        return [Span(group.num_tokens) for group in video.groups]

    def positions(
        self,
        config: ModelConfig,
        num_tokens: int,
        ranges: Sequence[PlaceholderRange],
        grids: Sequence[tuple[int, int, int]],
        groups: Sequence[GroupPlacement | None] = (),
    ) -> tuple[torch.Tensor, int]:
        return mrope_positions(num_tokens, ranges, grids, spatial_merge_size(config), groups)

    def pixels_match(self, config: ModelConfig, pixel_values: torch.Tensor, grid_thw: tuple[int, int, int], num_tokens: int) -> bool:
        t, h, w = grid_thw
        num_patches = t * h * w
        return (
            pixel_values.dim() == 2 and pixel_values.shape[0] == num_patches and num_tokens * spatial_merge_size(config) ** 2 == num_patches
        )

    def build_decoder(self, config: ModelConfig, weights: dict[str, torch.Tensor]) -> TextDecoder:
        decoder = TextDecoder(config.text)
        decoder.load(weights)
        return decoder

    def build_vision(
        self, config: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device, *, prepack: bool
    ) -> VisionEncoder:
        return VisionEncoder(build_vision_tower(config, weights, dtype, device, prepack=prepack), spatial_merge_size(config))


FAMILY = Qwen2VLFamily()
