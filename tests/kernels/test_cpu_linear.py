"""Prepacked oneDNN linears: the same results as F.linear at every row count, and only a few
input shapes ever reach oneDNN (one cached primitive each), whatever the row counts seen."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from kernels import cpu_linear
from kernels.cpu_linear import (
    MAX_PIECE_ROWS,
    PACKED_ROW_BUCKETS,
    TIMED_MANY_ROWS,
    PackedLinear,
    PackedPatchConv,
    pack_linears,
    packed_rows,
    packing_available,
)

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build cannot prepack for oneDNN")


@pytest.fixture(params=[True, False], ids=["oneDNN-wins", "MKL-wins"])
def packed_wins(request, monkeypatch):
    """Every timing comes out the same way, so both paths of every row class run."""
    monkeypatch.setattr(PackedLinear, "_packed_wins", lambda self, num_rows: request.param)
    return request.param


@pytest.mark.parametrize("num_rows", [1, 2, 3, 5, 9, 17, 33, 63, 64, 65, 200, 512, 513, 1100])
def test_packed_linear_equals_f_linear(num_rows, packed_wins):
    torch.manual_seed(num_rows)
    weight, bias, x = torch.randn(96, 48), torch.randn(96), torch.randn(num_rows, 48)
    out = PackedLinear(weight, bias)(x)
    assert out.shape == (num_rows, 96)
    torch.testing.assert_close(out, F.linear(x, weight, bias), atol=1e-4, rtol=1e-4)


def test_row_counts_are_padded_to_a_few_buckets():
    assert [packed_rows(n) for n in (2, 3, 4, 5, 9, 16, 17, 63, 64, 65, 300, 512)] == [2, 4, 4, 8, 16, 16, 24, 64, 64, 128, 320, 512]
    assert {packed_rows(n) for n in range(2, MAX_PIECE_ROWS + 1)} == set(PACKED_ROW_BUCKETS)
    assert len(PACKED_ROW_BUCKETS) <= 20  # one oneDNN primitive per bucket and weight, cached


def test_long_inputs_reach_onednn_only_in_bucketed_pieces(monkeypatch):
    monkeypatch.setattr(PackedLinear, "_packed_wins", lambda self, num_rows: True)
    linear = PackedLinear(torch.randn(16, 8), None)
    seen: list[int] = []
    real = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", lambda x, *args: seen.append(x.shape[0]) or real(x, *args))
    for num_rows in (70, 511, 1300):
        linear(torch.randn(num_rows, 8))
    assert seen == [128, 512, 512, 512, 320]


def test_pack_linears_replaces_every_float32_linear():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 4, bias=False)))
    x = torch.randn(3, 8)
    expected = model(x)
    assert pack_linears(model) == 2
    assert isinstance(model[0], PackedLinear) and isinstance(model[2][0], PackedLinear)
    torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)


def test_only_a_large_weight_is_timed_for_one_row_and_every_weight_for_many(monkeypatch):
    monkeypatch.setattr(cpu_linear, "CALIBRATE_MIN_BYTES", 96 * 48 * 4)  # this weight counts as large
    timed = []
    monkeypatch.setattr(PackedLinear, "_packed_wins", lambda self, num_rows: timed.append(num_rows) or True)
    large = PackedLinear(torch.randn(96, 48), None)
    assert timed == [1, TIMED_MANY_ROWS] and large.one_row_packed and large.many_rows_packed
    small = PackedLinear(torch.randn(8, 4), None)  # below the size: one row stays on MKL, untimed
    assert timed == [1, TIMED_MANY_ROWS, TIMED_MANY_ROWS] and not small.one_row_packed


def test_timings_run_both_paths_once_per_weight_shape(monkeypatch):
    monkeypatch.setattr(cpu_linear, "_packed_wins_by_shape", {})
    num_timings = []
    real = PackedLinear._time_paths
    monkeypatch.setattr(PackedLinear, "_time_paths", lambda self, num_rows: num_timings.append(num_rows) or real(self, num_rows))
    first = PackedLinear(torch.randn(64, 32), None)
    PackedLinear(torch.randn(64, 32), None)  # same shape: the first timing holds
    assert num_timings == [TIMED_MANY_ROWS] and first.many_rows_packed in (True, False)


@pytest.mark.parametrize("kernel", [(2, 14, 14), (1, 4, 4)])
def test_a_patch_convolution_equals_the_convolution(kernel, packed_wins):
    torch.manual_seed(0)
    conv = nn.Conv3d(3, 32, kernel_size=kernel, stride=kernel, bias=kernel[0] == 1)
    x = torch.randn(70, 3, *kernel)
    expected = conv(x)
    out = PackedPatchConv(conv)(x)
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_an_overlapping_convolution_is_not_a_patch_product():
    with pytest.raises(ValueError, match="non-overlapping"):
        PackedPatchConv(nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 2, 2)))
    with pytest.raises(ValueError, match="one kernel each"):
        PackedPatchConv(nn.Conv3d(3, 8, kernel_size=2, stride=2))(torch.randn(4, 3, 4, 4, 4))
