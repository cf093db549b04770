"""Linear layers with weights prepacked once for oneDNN, for float32 on CPU.

Why: MKL's sgemm packs the weight matrix into its blocked layout on every call. With many input
rows (a prefill) the packing is amortized; with a few (a decode step of 4 or 16 streams) it is
most of the call. The LM head of the small built-in model, a 768 x 151,936 float32 matrix, took
80 ms for 4 rows against 19 ms for 1 (one thread); prepacked for oneDNN it takes 54-60 ms, and
16 rows 90 ms instead of 130-159 ms (benchmarks/decode_step_bench.py; docs/benchmarks.md).
vLLM's CPU backend prepacks its weights for oneDNN for the same reason.

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
# length would each add one, and a prefill node's RSS grew without end (the soak: +18% in 3
# minutes). So only the few-row shapes of decode steps, where packing pays, go to oneDNN, and
# their row counts are padded up to one of a few buckets: at most len(PACKED_ROW_BUCKETS) shapes
# per layer, all seen within the first busy minute. (Without buckets, each of the 63 row counts
# was a shape, and a prefill node that meets short suffixes only now and then kept adding them
# for minutes: +5% RSS over a 10-minute soak.) Zero rows cost little at these sizes, where
# reading the weight dominates; longer inputs amortize MKL's packing anyway.
PACKED_ROW_BUCKETS = (2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
MAX_PACKED_ROWS = PACKED_ROW_BUCKETS[-1]


# One row: MKL's matrix-vector product beat oneDNN on the machine this was first measured on
# (an LM-head step 69 ms on oneDNN against 48 ms), and oneDNN beat MKL on another (an AMD EPYC:
# 11.8 against 15.9 ms, one thread). Which wins depends on the CPU, so a weight this large (where
# a step's time is reading it) is timed both ways once, when packed; smaller ones stay on MKL,
# where the two are within a few microseconds.
CALIBRATE_MIN_BYTES = 32 << 20
NUM_CALIBRATION_RUNS = 7


def packed_rows(num_rows: int) -> int:
    """The bucket ``num_rows`` (2..MAX_PACKED_ROWS) is padded up to."""
    return next(b for b in PACKED_ROW_BUCKETS if b >= num_rows)


class PackedLinear(nn.Module):
    """``F.linear(x, weight, bias)`` for 2-D float32 ``x`` on CPU. More than MAX_PACKED_ROWS rows
    (prefills) run MKL on the plain [in, out] weight, and so does one row (a decode step of one
    stream) unless this weight was timed faster on oneDNN (``one_row_packed``); between the two,
    oneDNN runs on the prepacked weight. Both copies are kept."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *, weight_t: torch.Tensor | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None))
        # [in, out], contiguous: x @ weight_t is the fast single-row path (a caller may share its own).
        self.register_buffer("weight_t", weight.detach().t().contiguous() if weight_t is None else weight_t)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.one_row_packed = weight.numel() * weight.element_size() >= CALIBRATE_MIN_BYTES and self._packed_wins_one_row()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        num_rows = x.shape[0]
        if num_rows == 1 and self.one_row_packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")
        if num_rows == 1 or num_rows > MAX_PACKED_ROWS:
            out = torch.mm(x, self.weight_t)
            return out if self.bias is None else out.add_(self.bias)
        padded = packed_rows(num_rows)
        if padded != num_rows:
            x = torch.cat([x, x.new_zeros(padded - num_rows, x.shape[1])])
        out = torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")
        return out if padded == num_rows else out[:num_rows]

    @torch.inference_mode()
    def _packed_wins_one_row(self) -> bool:
        """Whether oneDNN's one-row product on the packed weight is faster than MKL's on the
        plain one. The two are timed in turns, and each keeps its fastest run: a node times this
        while the other roles load beside it, and interference only ever adds time."""
        x = torch.zeros(1, self.in_features)
        paths = {
            "oneDNN": lambda: torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, None, "none", [], ""),
            "MKL": lambda: torch.mm(x, self.weight_t),
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
            "one-row product of a %dx%d weight: oneDNN %.1f ms, MKL %.1f ms",
            self.out_features,
            self.in_features,
            fastest["oneDNN"] * 1e3,
            fastest["MKL"] * 1e3,
        )
        return fastest["oneDNN"] < fastest["MKL"]


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
