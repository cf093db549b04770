"""The KV page wire format: round trip, and refusal of pages this node would misread."""

from __future__ import annotations

import pytest
import torch

from services.engine.kv_pages import PAGE_FORMAT, KVPages, PageFormatError, pack, unpack


def pages(num_layers: int = 2, num_blocks: int = 3, num_state_layers: int = 0) -> KVPages:
    layers = [(torch.randn(num_blocks, 4, 2, 8), torch.randn(num_blocks, 4, 2, 8)) for _ in range(num_layers)]
    return KVPages(layers, [(torch.randn(12, 3), torch.randn(2, 4, 4)) for _ in range(num_state_layers)])


def test_pages_round_trip_with_their_format_named():
    original = pages()
    tensors, meta = pack(original)
    assert meta == {"format": PAGE_FORMAT, "num_layers": 2, "num_state_layers": 0, "num_blocks": 3, "prefix_blocks": 0}
    for (k, v), (k2, v2) in zip(original.layers, unpack(tensors, meta, 2).layers):
        assert torch.equal(k, k2) and torch.equal(v, v2)


def test_a_hybrid_requests_state_travels_with_its_pages():
    original = pages(num_state_layers=3)
    tensors, meta = pack(original)
    received = unpack(tensors, meta, 2, 3)
    assert len(received.states) == 3
    for (conv, state), (conv2, state2) in zip(original.states, received.states):
        assert torch.equal(conv, conv2) and torch.equal(state, state2)
    assert unpack(*pack(pages()), 2, 3).states == []  # a cached prefix comes without state
    original.prefix_states, original.prefix_blocks = original.states[::-1], 2  # the state saved after block 2
    received = unpack(*pack(original), 2, 3)
    assert received.prefix_blocks == 2 and all(torch.equal(a[1], b[1]) for a, b in zip(received.prefix_states, original.states[::-1]))
    original.prefix_blocks = 4
    with pytest.raises(PageFormatError, match="after block 4 of 3"):
        unpack(*pack(original), 2, 3)
    with pytest.raises(PageFormatError, match="state for 3 layers"):
        unpack(tensors, meta, 2, 6)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t, m: m.update(format="tessera-kv-pages/0"), "format"),
        (lambda t, m: m.update(num_layers=3), "layers"),
        (lambda t, m: t.pop("v1"), "lack tensor v1"),
        (lambda t, m: t.pop("state1"), "lack tensor state1"),
        (lambda t, m: m.update(num_blocks=2), "block count"),
    ],
)
def test_pages_this_node_would_misread_are_refused(change, message):
    tensors, meta = pack(pages(num_state_layers=2))
    change(tensors, meta)
    with pytest.raises(PageFormatError, match=message):
        unpack(tensors, meta, 2, 2)
