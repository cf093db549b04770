"""The KV page wire format: round trip, and refusal of pages this node would misread."""

from __future__ import annotations

import pytest
import torch

from services.engine.kv_pages import PAGE_FORMAT, PageFormatError, pack, unpack


def pages(num_layers: int = 2, num_blocks: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.randn(num_blocks, 4, 2, 8), torch.randn(num_blocks, 4, 2, 8)) for _ in range(num_layers)]


def test_pages_round_trip_with_their_format_named():
    original = pages()
    tensors, meta = pack(original)
    assert meta == {"format": PAGE_FORMAT, "num_layers": 2, "num_blocks": 3}
    for (k, v), (k2, v2) in zip(original, unpack(tensors, meta, 2)):
        assert torch.equal(k, k2) and torch.equal(v, v2)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t, m: m.update(format="tessera-kv-pages/0"), "format"),
        (lambda t, m: m.update(num_layers=3), "layers"),
        (lambda t, m: t.pop("v1"), "lack tensor v1"),
        (lambda t, m: m.update(num_blocks=2), "block count"),
    ],
)
def test_pages_this_node_would_misread_are_refused(change, message):
    tensors, meta = pack(pages())
    change(tensors, meta)
    with pytest.raises(PageFormatError, match=message):
        unpack(tensors, meta, 2)
