"""What the suites share: where results go, the command and machine lines of a result's JSON,
and writing it."""

from __future__ import annotations

import math
import os
import platform
import shlex
import sys
from pathlib import Path

from services.bench import portable
from services.bench.workloads import image_size

__all__ = ["RESULTS", "command", "image_size", "machine", "ms", "percentile_ms", "usage_error", "write_json"]

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def command(args) -> str:
    """How this run was asked for, as ``tessera bench --suite NAME ...``."""
    return shlex.join(["tessera", "bench", "--suite", args.suite, *args.suite_argv])


def machine(**extra) -> dict:
    return {"cpus": os.cpu_count(), "platform": platform.platform(), **extra}


def write_json(path: Path, result: dict, indent: int = 2) -> None:
    """The result, with no path of this machine in it (services/bench/portable.py)."""
    portable.write_json(path, result, indent)
    print(f"wrote {path}")


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def percentile_ms(seconds: list[float], q: float) -> float | None:
    """The q-th value of sorted ``seconds``, in ms, where every request is counted: a refused or
    failed one is inf, and a percentile that falls on one is None (never a figure over survivors)."""
    if not seconds:
        return None
    value = seconds[min(len(seconds) - 1, math.ceil(q * len(seconds)) - 1)]
    return None if math.isinf(value) else ms(value)


def usage_error(args, message: str) -> int:
    """What argparse does with a bad combination of flags: the message, exit status 2."""
    print(f"tessera bench --suite {args.suite}: error: {message}", file=sys.stderr)
    return 2
