"""The gemma3 family's tensor side (services/models/family.py's ModelFamily): loaded only by the
roles that run the model; the package's INFO says what the gateway and the registry need."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from services.models.builtins import gemma3 as builtin
from services.models.family import ImageOptions, ModelConfig, PlaceholderCountError, ProcessedImage, ProgressFn
from services.models.gemma3 import INFO
from services.models.gemma3.config import read_config, tokens_per_side, weight_group
from services.models.gemma3.decoder import TextDecoder
from services.models.gemma3.image_processor import Gemma3ImageProcessor
from services.models.gemma3.prompt import expand_text, expand_token_ids, soft_token_runs
from services.models.gemma3.vision import VisionEncoder, build_vision
from shared.types import PlaceholderRange


class Gemma3Family:
    name = INFO.name
    model_types = INFO.model_types
    bidirectional_images = True
    tool_call_parser = INFO.tool_call_parser

    def builtins(self) -> Mapping[str, object]:
        return builtin.BUILTIN_SPECS

    def write_checkpoint(self, name: str, out: Path, progress: ProgressFn) -> int:
        return builtin.write_checkpoint(builtin.BUILTIN_SPECS[name], out, progress)

    def read_config(self, path: Path) -> ModelConfig:
        return read_config(path)

    def weight_group(self, name: str) -> tuple[str, str] | None:
        return weight_group(name)

    def image_processor(self, path: Path, options: ImageOptions) -> Gemma3ImageProcessor:
        return Gemma3ImageProcessor(path, tokens_per_side=tokens_per_side(read_config(path)), do_pan_and_scan=options.do_pan_and_scan)

    def video_processor(self, path: Path, config: ModelConfig, image_processor) -> None:
        return None  # Gemma3 takes no video

    def expand_prompt(
        self,
        config: ModelConfig,
        tokenizer,
        prompt: str | Sequence[int],
        parts_per_image: Sequence[Sequence[ProcessedImage]],
        videos: Sequence = (),
    ) -> tuple[list[int], list[PlaceholderRange]]:
        if videos:
            raise PlaceholderCountError(f"{config.model_type} takes no video")
        views = [(len(parts), parts[0].num_tokens) for parts in parts_per_image]
        if isinstance(prompt, str):
            token_ids = tokenizer.encode(expand_text(prompt, views), add_special_tokens=False)
        else:
            token_ids = expand_token_ids(tokenizer, prompt, int(config.hf.boi_token_index), views)
        ranges = soft_token_runs(token_ids, config.image_token_id)
        expected = [part.num_tokens for parts in parts_per_image for part in parts]
        if [r.length for r in ranges] != expected:
            raise PlaceholderCountError("the prompt holds image soft tokens of its own; only <start_of_image> marks an image")
        return token_ids, ranges

    def positions(
        self,
        config: ModelConfig,
        num_tokens: int,
        ranges: Sequence[PlaceholderRange],
        grids: Sequence[tuple[int, int, int]],
        groups: Sequence = (),
    ) -> tuple[torch.Tensor, int]:
        return torch.arange(num_tokens, dtype=torch.long).expand(3, -1).contiguous(), 0

    def pixels_match(self, config: ModelConfig, pixel_values: torch.Tensor, grid_thw: tuple[int, int, int], num_tokens: int) -> bool:
        views, h, w = grid_thw
        size = config.hf.vision_config.image_size
        return tuple(pixel_values.shape) == (views, 3, size, size) and num_tokens == views * h * w

    def build_decoder(self, config: ModelConfig, weights: dict[str, torch.Tensor]) -> TextDecoder:
        decoder = TextDecoder(config.text)
        decoder.load(weights)
        return decoder

    def build_vision(
        self, config: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device, *, prepack: bool
    ) -> VisionEncoder:
        return VisionEncoder(build_vision(config, weights, dtype, device, prepack=prepack))


FAMILY = Gemma3Family()
