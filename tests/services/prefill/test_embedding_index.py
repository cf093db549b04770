"""What a prefill node publishes about the embeddings it holds: each new one once, with the grid
of the request that brought it, and each one gone (evicted) once."""

from __future__ import annotations

import torch

from services.prefill.embedding_index import EmbeddingIndex
from shared.index.types import MmEntry
from shared.types import MmHash

A, B = MmHash("a"), MmHash("b")


def rows(n: int) -> torch.Tensor:
    return torch.zeros(n, 8)


def test_new_embeddings_are_stored_once_and_gone_ones_evicted_once():
    index = EmbeddingIndex()
    index.remember_grid(A, (1, 4, 4))
    index.remember_grid(B, (1, 4, 8))
    first = index.changes({A: rows(4)})
    assert first is not None and first.mm_stored == {A: MmEntry(4, (1, 4, 4), 4 * 8 * 4)} and first.mm_evicted == []
    assert index.changes({A: rows(4)}) is None  # nothing changed
    second = index.changes({B: rows(8)})
    assert second is not None and set(second.mm_stored) == {B} and second.mm_evicted == [A]
    assert index.changes({B: rows(8)}) is None


def test_an_image_whose_grid_is_unknown_is_not_published():
    index = EmbeddingIndex()
    assert index.changes({A: rows(4)}) is None
    index.remember_grid(A, (1, 4, 4))
    events = index.changes({A: rows(4)})
    assert events is not None and set(events.mm_stored) == {A}
