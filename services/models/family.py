"""The model-family interface: what a family brings, and the records it exchanges with the engine,
the encoder and preprocessing.

A family is one folder under ``services/models/`` plus one row in ``registry.FAMILIES``. The
package's ``INFO`` (a ``FamilyInfo``) is all that resolving a model needs, and imports no torch,
so the gateway, which runs no model, never loads it; its ``family`` module holds the
``ModelFamily`` below, loaded by ``FamilyInfo.load`` in the roles that run the model. It owns:
  - its config reader (``read_config``) and weight-name mapping (``weight_group``);
  - its image processor (resize, crops, normalisation) and the processor settings that enter
    ``mm_hash`` (``ImageProcessor.kwargs_for_hash``); its video processor, or none
    (``video_processor``, services/models/video.py);
  - its prompt layout: how an image or video marker becomes placeholder tokens (``expand_prompt``)
    and the positions of every prompt token (``positions``: M-RoPE or 1-D);
  - its vision tower and projector (``build_vision``) and its text decoder on our paged KV
    (``build_decoder``);
  - its built-in checkpoints (``builtins`` and ``write_checkpoint``).
Nothing outside the family folder branches on the model type.

Positions are always a (3, num_tokens) tensor plus a delta, whatever the family: a 1-D family
repeats its positions on the three rows with delta 0, so requests, the wire and the decode nodes
carry one shape.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from services.models.media_cost import MediaCostModel
from shared.types import GroupPlacement, PlaceholderRange

if TYPE_CHECKING:
    import torch
    from PIL import Image

    from services.models.video import ProcessedVideo, VideoProcessor

ProgressFn = Callable[[str], None]


class PlaceholderCountError(ValueError):
    """The prompt's image markers and the request's images differ in number."""


@dataclass(frozen=True, slots=True)
class ProcessedImage:
    """One image (or one crop of it) ready for the vision tower.

    pixel_values: the family's tower input (Qwen2-VL: patchified rows; Gemma3: crops of 3xSxS)
    grid_thw: the family's patch grid; ``ImageProcessor.num_tokens(grid_thw)`` is its placeholder length
    num_tokens: placeholder tokens the image expands to
    """

    pixel_values: torch.Tensor | None  # None: not processed here (an encoder holds its embeddings)
    grid_thw: tuple[int, int, int]
    num_tokens: int

    @property
    def num_bytes(self) -> int:
        return 0 if self.pixel_values is None else self.pixel_values.numel() * self.pixel_values.element_size()

    def without_pixels(self) -> ProcessedImage:
        return ProcessedImage(None, self.grid_thw, self.num_tokens)


@dataclass(frozen=True, slots=True)
class ImageOptions:
    """Request-independent image settings a deployment may change (each enters mm_hash)."""

    min_pixels: int | None = None
    max_pixels: int | None = None
    do_pan_and_scan: bool | None = None


@dataclass(frozen=True, slots=True)
class StateShape:
    """A hybrid decoder's linear-attention layers (Qwen3.5's Gated DeltaNet): each keeps, per
    request, a fixed-size state instead of KV: the last ``conv_width`` inputs of its causal
    convolution (conv_dim channels) and a recurrent matrix per value head (key_dim x value_dim)."""

    layers: tuple[int, ...]  # the decoder layers that hold this state and no KV
    conv_dim: int
    conv_width: int  # kernel size - 1
    num_heads: int
    key_dim: int
    value_dim: int

    def bytes_per_request(self, dtype_bytes: int = 4) -> int:
        per_layer = self.conv_dim * self.conv_width + self.num_heads * self.key_dim * self.value_dim
        return len(self.layers) * per_layer * dtype_bytes


@dataclass(frozen=True, slots=True)
class TextShape:
    """What the KV pool, the KV page format and the engine need of any text decoder."""

    vocab_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    # Per layer: the keys it reads back (a sliding window of that many positions), or None for all.
    layer_windows: tuple[int | None, ...]
    # A hybrid decoder's state-holding layers, or None: every layer keeps KV.
    state: StateShape | None = None

    @property
    def kv_layers(self) -> tuple[int, ...]:
        """The layers that keep KV, in order."""
        stateful = set(self.state.layers) if self.state is not None else set()
        return tuple(layer for layer in range(self.num_layers) if layer not in stateful)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A checkpoint's config as read by its family. ``text`` is the family's own text config
    (it has at least TextShape's fields); ``hf`` is transformers' config object for the same file
    (services/models/hf_config.py), whose defaults fill whatever the file leaves out."""

    model_type: str
    text: Any
    hf: Any  # transformers.PretrainedConfig (not imported here: the gateway loads no transformers)
    image_token_id: int
    eos_token_ids: tuple[int, ...]

    @property
    def shape(self) -> TextShape:
        t = self.text
        windows = getattr(t, "layer_windows", None) or (None,) * t.num_layers
        state = getattr(t, "state_shape", None)
        return TextShape(t.vocab_size, t.num_layers, t.num_heads, t.num_kv_heads, t.head_dim, tuple(windows), state)


class ImageProcessor(Protocol):
    num_processed: int

    @property
    def kwargs_for_hash(self) -> dict[str, object]:
        """Every setting that changes the processed output; part of each image's mm_hash."""

    def process(self, image: Image.Image) -> ProcessedImage: ...

    def cost_model(self) -> MediaCostModel:
        """Its placeholder tokens from an image's size alone, torch-free (the gateway's estimate)."""

    def num_tokens(self, grid_thw: tuple[int, int, int]) -> int:
        """Placeholder tokens of an image with this grid (grids come back from the index)."""

    def split(self, image: ProcessedImage) -> list[ProcessedImage]:
        """The image's parts that each fill one contiguous placeholder span, in prompt order:
        the image itself, or (Gemma3 Pan-and-Scan) the full view and each crop."""


class VisionEncoder(Protocol):
    num_items_encoded: int
    seconds_encoding: float  # wall time of its encode calls
    # The module tree its weights load into, named as weight_group's "vision" names: where a LoRA
    # adapter's tower and projector updates attach (services/models/lora/tower.py).
    module: Any

    def encode(self, pixel_values: list[torch.Tensor], grids_thw: list[tuple[int, int, int]]) -> list[torch.Tensor]:
        """One (num_tokens, text_hidden) embedding tensor per image part, in order."""


@dataclass(frozen=True, slots=True)
class FamilyInfo:
    """A family as known before its tensor code loads."""

    name: str
    model_types: tuple[str, ...]
    builtin_names: tuple[str, ...]
    # The parser that turns the model's text into tool calls for tool_choice "auto"
    # (services/gateway/output/tool_calls.py), or None when the family has none.
    tool_call_parser: str | None
    module: str  # the module whose ``FAMILY`` is this family's ModelFamily
    names_module: str  # a module with no torch whose ``weight_group`` is the family's (ModelFamily.weight_group)

    def load(self) -> ModelFamily:
        return importlib.import_module(self.module).FAMILY

    def weight_group(self, name: str) -> tuple[str, str] | None:
        """The family's weight-name mapping, without its tensor code (the gateway asks which
        side of the model a LoRA adapter changes)."""
        return importlib.import_module(self.names_module).weight_group(name)


class ModelFamily(Protocol):
    name: str
    model_types: tuple[str, ...]
    # Tokens of one image attend to each other both ways (Gemma3): an image span is never split
    # across prefill chunks (a prefix hit may end inside one: see kv_cache_manager.py).
    bidirectional_images: bool
    tool_call_parser: str | None  # as FamilyInfo's

    def builtins(self) -> Mapping[str, object]:
        """Built-in model name -> its spec."""

    def write_checkpoint(self, name: str, out: Path, progress: ProgressFn) -> int:
        """Write built-in ``name`` into the empty directory ``out``; returns its parameter count."""

    def read_config(self, path: Path) -> ModelConfig: ...

    def weight_group(self, name: str) -> tuple[str, str] | None:
        """("text" | "vision", normalized name) for a checkpoint tensor name; None to skip it."""

    def image_processor(self, path: Path, options: ImageOptions) -> ImageProcessor: ...

    def video_processor(self, path: Path, config: ModelConfig, image_processor: ImageProcessor) -> VideoProcessor | None:
        """The family's video processor (services/models/video.py), or None: it takes no video."""

    def expand_prompt(
        self,
        config: ModelConfig,
        tokenizer: Any,
        prompt: str | Sequence[int],
        parts_per_image: Sequence[Sequence[ProcessedImage]],
        videos: Sequence[ProcessedVideo] = (),
    ) -> tuple[list[int], list[PlaceholderRange]]:
        """Token ids with every image and video marker expanded, and one range per image part in
        order, then one per video group in order. ``prompt`` is rendered text (tokenized here) or
        token ids. Raises PlaceholderCountError."""

    def positions(
        self,
        config: ModelConfig,
        num_tokens: int,
        ranges: Sequence[PlaceholderRange],
        grids: Sequence[tuple[int, int, int]],
        groups: Sequence[GroupPlacement | None] = (),
    ) -> tuple[torch.Tensor, int]:
        """((3, num_tokens) int64 positions, delta): generated token k sits at num_tokens + k + delta.
        ``groups[i]``: where item i sits in its video, None (or no entry) for an image part."""

    def pixels_match(self, config: ModelConfig, pixel_values: torch.Tensor, grid_thw: tuple[int, int, int], num_tokens: int) -> bool:
        """Whether a pixel tensor received over the wire fits its part's grid and placeholder."""

    def build_decoder(self, config: ModelConfig, weights: dict[str, torch.Tensor]) -> torch.nn.Module: ...

    def build_vision(
        self, config: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device, *, prepack: bool
    ) -> VisionEncoder: ...
