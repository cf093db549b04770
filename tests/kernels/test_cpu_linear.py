"""Prepacked oneDNN linears: the same results as F.linear at every row count, and only a few
input shapes ever reach oneDNN (one cached primitive each), whatever the row counts seen."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from kernels import cpu_linear
from kernels.cpu_linear import MAX_PACKED_ROWS, PACKED_ROW_BUCKETS, PackedLinear, pack_linears, packed_rows, packing_available

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build cannot prepack for oneDNN")


@pytest.mark.parametrize("num_rows", [1, 2, 3, 5, 9, 17, 33, 63, 64, 65, 200])
def test_packed_linear_equals_f_linear(num_rows):
    torch.manual_seed(num_rows)
    weight, bias, x = torch.randn(96, 48), torch.randn(96), torch.randn(num_rows, 48)
    out = PackedLinear(weight, bias)(x)
    assert out.shape == (num_rows, 96)
    torch.testing.assert_close(out, F.linear(x, weight, bias), atol=1e-4, rtol=1e-4)


def test_row_counts_are_padded_to_a_few_buckets():
    assert [packed_rows(n) for n in (2, 3, 4, 5, 9, 16, 17, 63, 64)] == [2, 4, 4, 8, 16, 16, 24, 64, 64]
    assert {packed_rows(n) for n in range(2, MAX_PACKED_ROWS + 1)} == set(PACKED_ROW_BUCKETS)


def test_pack_linears_replaces_every_float32_linear():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 4, bias=False)))
    x = torch.randn(3, 8)
    expected = model(x)
    assert pack_linears(model) == 2
    assert isinstance(model[0], PackedLinear) and isinstance(model[2][0], PackedLinear)
    torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("one_row_packed", [True, False])
def test_a_large_weight_is_timed_for_one_row_and_either_path_equals_f_linear(monkeypatch, one_row_packed):
    monkeypatch.setattr(cpu_linear, "CALIBRATE_MIN_BYTES", 96 * 48 * 4)  # this weight counts as large
    timed = []
    monkeypatch.setattr(PackedLinear, "_packed_wins_one_row", lambda self: timed.append(self) or one_row_packed)
    torch.manual_seed(0)
    weight, bias, x = torch.randn(96, 48), torch.randn(96), torch.randn(1, 48)
    linear = PackedLinear(weight, bias)
    assert len(timed) == 1 and linear.one_row_packed is one_row_packed
    torch.testing.assert_close(linear(x), F.linear(x, weight, bias), atol=1e-4, rtol=1e-4)
    small = PackedLinear(torch.randn(8, 4), None)  # below the size: never timed, one row on MKL
    assert len(timed) == 1 and not small.one_row_packed


def test_the_one_row_timing_runs_both_paths():
    linear = PackedLinear(torch.randn(64, 32), None)
    assert linear._packed_wins_one_row() in (True, False)
