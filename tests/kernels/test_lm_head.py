"""The chunked LM head: the same logits as F.linear, and the same argmax as the full logits,
ties to the lowest token id and NaN rows included, across block, chunk and row-piece borders."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from kernels import lm_head
from kernels.cpu_linear import packing_available
from kernels.lm_head import ChunkedLmHead

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build cannot prepack for oneDNN")


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(lm_head, "VOCAB_CHUNK", 100)  # 1050 tokens: eleven chunks, the last partial
    monkeypatch.setattr(lm_head, "ARGMAX_BLOCK", 25)  # four blocks a chunk; the last chunk's 50 tokens are one
    monkeypatch.setattr(lm_head, "ARGMAX_PIECE_ROWS", 64)


@pytest.mark.parametrize("num_rows", [1, 3, 70, 300])
def test_logits_and_argmax_equal_the_full_product(num_rows):
    torch.manual_seed(num_rows)
    weight, hidden = torch.randn(1050, 32), torch.randn(num_rows, 32)
    head = ChunkedLmHead(weight)
    expected = F.linear(hidden, weight)
    torch.testing.assert_close(head(hidden), expected, atol=1e-4, rtol=1e-4)
    assert head.argmax(hidden) == head(hidden).argmax(dim=1).tolist()
    assert head.argmax(hidden) == expected.argmax(dim=1).tolist()


def test_ties_across_blocks_and_chunks_go_to_the_lowest_token_id():
    weight = torch.randn(1000, 16)
    weight[[160, 180, 450, 999]] = weight[20] * 5  # 160 and 180: one chunk, two blocks
    weight[[540, 545]] = weight[21] * 5  # one block
    hidden = torch.stack([weight[20], weight[21]]).repeat(40, 1)  # 80 rows: past a few
    assert ChunkedLmHead(weight).argmax(hidden) == [160, 540] * 40


def test_a_nan_row_takes_the_full_logits_argmax():
    weight, hidden = torch.randn(1000, 16), torch.randn(80, 16)  # two pieces of rows
    weight[730, 3] = float("nan")  # only a later chunk sees it
    head = ChunkedLmHead(weight)
    assert head.argmax(hidden) == head(hidden).argmax(dim=1).tolist() == [730] * 80
