"""Pixels of the images a prefill node encodes itself (the router's adaptive dispatch).

The gateway pushes them before the Prefill call, keyed by the request attempt (key_prefix +
mm_hash), so concurrent requests for one image never take each other's message. Each message is
claimed: the pixels of images still lacking are encoded by the node's own tower beside the
engine (embeddings.py), the rest held for the request's later windows (embedding_feed.py). A
tensor that does not match its image's grid and placeholder is refused before it is encoded.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from services.engine.remote_request import PromptItem
from services.transport.tensor_channel import TensorInbox
from shared.types import MmHash

# (pixel tensor, grid, placeholder length) -> whether they fit: the model family's rule.
PixelsMatchFn = Callable[[torch.Tensor, tuple[int, int, int], int], bool]


class MissingPixelsError(RuntimeError):
    """Pixels of images to encode never arrived here, or the encoder lacks them: the caller
    resends them."""

    def __init__(self, missing: list[str], message: str | None = None) -> None:
        super().__init__(message or f"pixels for {len(missing)} image(s) to encode here never arrived")
        self.missing = missing


class LocalEncodeUnavailableError(RuntimeError):
    """Asked to encode on a node that has no vision tower."""


class PixelsMismatchError(ValueError):
    """A pixel tensor that does not fit its image's grid and placeholder."""


async def take_pixels(
    inbox: TensorInbox, key_prefix: str, items: list[PromptItem], lacking: list[PromptItem], *, wait_s: float, pixels_match: PixelsMatchFn
) -> dict[MmHash, torch.Tensor]:
    """The pixels of ``items`` that arrived, by mm_hash: those among ``lacking`` awaited for up
    to ``wait_s``, the others taken if already here. Raises MissingPixelsError naming the
    lacking ones whose pixels did not arrive, and PixelsMismatchError for a tensor that does not
    fit its image."""
    wanted = {i.mm_hash for i in lacking}
    pixels: dict[MmHash, torch.Tensor] = {}
    missing: list[str] = []
    for item in items:
        message = await inbox.arrival(
            key_prefix + item.mm_hash, wait_s if item.mm_hash in wanted else 0.0, sender="a preprocess node", what="pixels of image"
        )
        if message is None:
            if item.mm_hash in wanted:
                missing.append(item.mm_hash)
            continue
        values = message.tensors.get("pixel_values")
        if values is None or not pixels_match(values, item.grid_thw, item.placeholder.length):
            raise PixelsMismatchError(f"pixels of image {item.mm_hash} do not match its grid {tuple(item.grid_thw)} and placeholder")
        pixels[item.mm_hash] = values
    if missing:
        raise MissingPixelsError(missing)
    return pixels
