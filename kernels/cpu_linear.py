"""Linear layers with weights prepacked once for oneDNN, for float32 on CPU.

Why, for few rows: MKL's sgemm packs the weight matrix into its blocked layout on every call.
With many input rows (a prefill) the packing is amortized; with a few (a decode step of 4 or 16
streams) it is most of the call (docs/benchmarks.md, "Prepacked weights at few rows").
vLLM's CPU backend prepacks its weights for oneDNN for the same reason.
Why, for many rows: on some CPUs (AMD's) MKL runs AVX2 code where oneDNN runs AVX-512, much
slower on prefills and vision-tower passes (docs/benchmarks.md, "oneDNN against MKL"); which
path wins is timed per weight shape.

Numerics: oneDNN sums in another order than MKL, so logits differ in the last bits (about 1e-4
on logits of magnitude ~100 in the built-in models), as they already do between batch sizes;
greedy outputs stay equal to transformers' on the oracle tests.

The op is ``torch.ops.mkldnn._linear_pointwise`` (what torch.compile's CPU freezing emits), so
``packing_available`` checks it exists and works before anything relies on it.
"""

from __future__ import annotations

import functools
import logging
import time

import torch
from torch import nn

log = logging.getLogger("tessera.cpu_linear")


@functools.cache
def packing_available() -> bool:
    """Whether this torch build can prepack linear weights for oneDNN (and gets it right)."""
    try:
        weight, x = torch.randn(8, 4), torch.randn(2, 4)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        out = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    except (AttributeError, RuntimeError):
        return False
    return bool(torch.allclose(out, x @ weight.t(), atol=1e-5))


# oneDNN builds and caches a primitive (with its own buffers) per input shape: prefills of every
# length would each add one, and a prefill node's RSS grew without end (docs/benchmarks.md,
# "Prepacked weights at few rows"). So the row counts oneDNN sees are padded up to a few buckets:
# fine ones for the few rows of decode steps, steps of 64 for longer inputs (prefill chunks,
# vision-tower passes), which run in pieces of at most MAX_PIECE_ROWS rows. That is at most
# len(PACKED_ROW_BUCKETS) shapes per weight, all seen within the first busy minute. (Without
# buckets, each of the 63 few-row counts was a shape, and a prefill node that meets short suffixes
# only now and then kept adding them for minutes.) Padding rows cost little: at most 63 per piece,
# and reading the weight dominates at few rows; pieces of 512 rows run about as fast as one
# product.
FEW_ROW_BUCKETS = (2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
MAX_FEW_ROWS = FEW_ROW_BUCKETS[-1]
MAX_PIECE_ROWS = 512
PACKED_ROW_BUCKETS = FEW_ROW_BUCKETS + tuple(range(2 * MAX_FEW_ROWS, MAX_PIECE_ROWS + 1, MAX_FEW_ROWS))

# Which path wins depends on the CPU, so it is timed, once per weight shape and row class, when a
# weight is packed:
#   * one row (a decode step of one stream): MKL's matrix-vector product beat oneDNN on one
#     machine and oneDNN beat MKL on another (docs/benchmarks.md, "oneDNN against MKL"). Only
#     weights this large are timed (a step's time is reading them); smaller ones stay on MKL,
#     within microseconds. (The LM head itself is now kernels/lm_head.py; this covers large layer
#     weights.)
#   * many rows (prefill, vision tower): on an AMD EPYC, MKL runs its AVX2 code where oneDNN runs
#     AVX-512, more than twice as fast (docs/benchmarks.md, "oneDNN against MKL"). Timed at
#     TIMED_MANY_ROWS rows for every weight shape.
#   * 2..64 rows: oneDNN, whose prepacked weight saves MKL's per-call packing.
CALIBRATE_MIN_BYTES = 32 << 20
TIMED_MANY_ROWS = 256
TIMED_OUT_FEATURES = 4096
NUM_CALIBRATION_RUNS = 7
_packed_wins_by_shape: dict[tuple[int, int, int], bool] = {}  # (out, in, rows timed) -> oneDNN faster


def packed_rows(num_rows: int) -> int:
    """The bucket ``num_rows`` (2..MAX_PIECE_ROWS) is padded up to."""
    return next(b for b in PACKED_ROW_BUCKETS if b >= num_rows)


def onednn_linear(x: torch.Tensor, packed_weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x`` [N, in] times a weight prepacked by ``_reorder_linear_weight`` (plus ``bias``) on
    oneDNN: N padded up to its bucket, in pieces of at most MAX_PIECE_ROWS rows."""
    num_rows = x.shape[0]
    if num_rows > MAX_PIECE_ROWS:
        return torch.cat([onednn_linear(piece, packed_weight, bias) for piece in x.split(MAX_PIECE_ROWS)])
    padded = num_rows if num_rows == 1 else packed_rows(num_rows)
    if padded != num_rows:
        x = torch.cat([x, x.new_zeros(padded - num_rows, x.shape[1])])
    out = torch.ops.mkldnn._linear_pointwise(x, packed_weight, bias, "none", [], "")
    return out if padded == num_rows else out[:num_rows]


class PackedLinear(nn.Module):
    """``F.linear(x, weight, bias)`` for float32 ``x`` on CPU (leading dimensions are flattened
    into rows, as F.linear treats them). One row runs on the faster of
    oneDNN and MKL for this weight (``one_row_packed``), 2..64 rows on oneDNN, and more rows on
    the faster of the two (``many_rows_packed``), in pieces of at most MAX_PIECE_ROWS. Both copies
    of the weight are kept: the prepacked one, and the plain [in, out] one for MKL."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None))
        # [in, out], contiguous: x @ weight_t is MKL's fast single-row path.
        self.register_buffer("weight_t", weight.detach().t().contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.one_row_packed = weight.numel() * weight.element_size() >= CALIBRATE_MIN_BYTES and self._packed_wins(1)
        self.many_rows_packed = self._packed_wins(TIMED_MANY_ROWS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:
            return self.forward(x.reshape(-1, self.in_features)).view(*x.shape[:-1], self.out_features)
        num_rows = x.shape[0]
        packed = self.one_row_packed if num_rows == 1 else num_rows <= MAX_FEW_ROWS or self.many_rows_packed
        return onednn_linear(x, self.packed_weight, self.bias) if packed else self._mkl(x)

    def _mkl(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.mm(x, self.weight_t)
        return out if self.bias is None else out.add_(self.bias)

    def _packed_wins(self, num_rows: int) -> bool:
        """Whether oneDNN is faster than MKL for this weight's shape at ``num_rows`` rows, timed
        once per shape in this process."""
        key = (self.out_features, self.in_features, num_rows)
        if key not in _packed_wins_by_shape:
            _packed_wins_by_shape[key] = self._time_paths(num_rows)
        return _packed_wins_by_shape[key]

    @torch.inference_mode()
    def _time_paths(self, num_rows: int) -> bool:
        """The two paths timed in turns, each keeping its fastest run: a node times this while
        the other roles load beside it, and interference only ever adds time. One row is timed on
        the whole weight (its time is reading it); many rows on at most TIMED_OUT_FEATURES of its
        outputs, where the arithmetic decides (a whole LM head would take seconds)."""
        packed, weight_t = self.packed_weight, self.weight_t
        if num_rows > 1 and self.out_features > TIMED_OUT_FEATURES:
            weight_t = self.weight_t[:, :TIMED_OUT_FEATURES].contiguous()
            packed = torch.ops.mkldnn._reorder_linear_weight(weight_t.t().contiguous(), None)
        x = torch.zeros(num_rows, self.in_features)
        paths = {
            "oneDNN": lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
            "MKL": lambda: torch.mm(x, weight_t),
        }
        fastest = dict.fromkeys(paths, float("inf"))
        for run in paths.values():
            run()  # untimed: first-call setup
        for _ in range(NUM_CALIBRATION_RUNS):
            for name, run in paths.items():
                started = time.perf_counter()
                run()
                fastest[name] = min(fastest[name], time.perf_counter() - started)
        log.info(
            "%d-row product of a %dx%d weight: oneDNN %.2f ms, MKL %.2f ms",
            num_rows,
            weight_t.shape[1],
            self.in_features,
            fastest["oneDNN"] * 1e3,
            fastest["MKL"] * 1e3,
        )
        return fastest["oneDNN"] < fastest["MKL"]


class PackedPatchConv(nn.Module):
    """A convolution whose kernel equals its stride, applied to inputs of exactly one kernel each
    (a vision tower's patch embedding: [N, C, T, P, P] -> [N, E, 1, 1, 1]) is a linear product
    over the flattened patch, run here as a PackedLinear. Why: oneDNN's direct 3-D convolution is
    several times slower than the same product as a linear (docs/benchmarks.md, "oneDNN
    against MKL")."""

    def __init__(self, conv: nn.Conv3d | nn.Conv2d) -> None:
        super().__init__()
        if tuple(conv.kernel_size) != tuple(conv.stride) or conv.groups != 1 or any(p != 0 for p in conv.padding):
            raise ValueError("only a non-overlapping, unpadded, ungrouped convolution is a linear product over patches")
        self.kernel_size = tuple(conv.kernel_size)
        self.in_channels = conv.in_channels
        self.register_buffer("weight", conv.weight.detach())  # read by callers for its dtype
        self.linear = PackedLinear(conv.weight.detach().reshape(conv.out_channels, -1), conv.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[1:]) != (self.in_channels, *self.kernel_size):
            raise ValueError(f"expected inputs of one kernel each, {(self.in_channels, *self.kernel_size)}, got {tuple(x.shape[1:])}")
        out = self.linear(x.reshape(x.shape[0], -1))
        return out.reshape(x.shape[0], -1, *([1] * len(self.kernel_size)))


def pack_linears(module: nn.Module) -> int:
    """Replace every float32 ``nn.Linear`` under ``module`` by a PackedLinear; returns how many."""
    num_packed = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear) and child.weight.dtype == torch.float32 and child.weight.device.type == "cpu":
            setattr(module, name, PackedLinear(child.weight, child.bias))
            num_packed += 1
        else:
            num_packed += pack_linears(child)
    return num_packed
