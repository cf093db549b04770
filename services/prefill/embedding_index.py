"""What a prefill node tells the index about the image embeddings it holds: the ones it pulled
from an encoder and the ones it encoded itself. The router then knows a request's images need no
encoder and no pixels on that node, and counts them as work the node holds.

After each engine step the embeddings present (the runner's encoder outputs) are compared with
what was published: new ones are stored, gone ones (evicted) are removed. The grid of each image
is remembered from the requests that brought it, because a preprocess node that finds an image
in the index takes its placeholder layout from there. An image whose grid is unknown is not
published (nothing is lost but a routing hint).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from shared.index.types import IndexEvents, MmEntry
from shared.types import MmHash


class EmbeddingIndex:
    def __init__(self) -> None:
        self._mm_hash_to_grid: dict[MmHash, tuple[int, int, int]] = {}
        self._published: set[MmHash] = set()

    def remember_grid(self, mm_hash: MmHash, grid_thw: tuple[int, int, int]) -> None:
        self._mm_hash_to_grid[mm_hash] = tuple(grid_thw)

    def changes(self, held: Mapping[MmHash, torch.Tensor]) -> IndexEvents | None:
        """The index events that make the published set equal ``held``; None when nothing changed.
        Runs on the engine thread, after every step: O(items held)."""
        stored = {}
        for mm_hash, embeds in held.items():
            if mm_hash in self._published:
                continue
            grid = self._mm_hash_to_grid.get(mm_hash)
            if grid is not None:
                stored[mm_hash] = MmEntry(embeds.shape[0], grid, embeds.numel() * embeds.element_size())
        evicted = [h for h in self._published if h not in held]
        if not stored and not evicted:
            return None
        self._published.update(stored)
        self._published.difference_update(evicted)
        for mm_hash in evicted:
            self._mm_hash_to_grid.pop(mm_hash, None)
        # Grids of images that never made it into the cache (a failed request) would pile up.
        if len(self._mm_hash_to_grid) > 4 * max(len(held), 256):
            self._mm_hash_to_grid = {h: g for h, g in self._mm_hash_to_grid.items() if h in held}
        return IndexEvents(mm_stored=stored, mm_evicted=evicted)
