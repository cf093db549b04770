"""The gateway process's footprint: ``tessera serve --role gateway`` up to its server's start (the
flags, every role's settings, the model's resolution), with the server itself replaced by a
report, so no index or node is needed. Each run is a fresh process; prints whether torch was
loaded, the seconds to that point and the peak RSS, and writes JSON (default
benchmarks/results/gateway_footprint.json).

    tessera bench --suite gateway_footprint [--runs 3] [--model DIR]

``--model`` defaults to a scratch directory holding only a Qwen2-VL config.json: resolving a model
reads nothing more.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.suites.common import RESULTS, command, machine, write_json

ROOT = Path(__file__).resolve().parents[2]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", type=Path, default=None, help="a checkpoint directory (default: a config-only scratch one)")
    parser.add_argument("--out", type=Path, default=RESULTS / "gateway_footprint.json")


def run(args: argparse.Namespace) -> int:
    model = args.model or Path(tempfile.mkdtemp(prefix="tessera-footprint-"))
    if args.model is None:
        (model / "config.json").write_text('{"model_type": "qwen2_vl"}')
    runs = [_probe_in_a_fresh_process(model) for _ in range(args.runs)]
    print(f"{'run':>4} {'torch loaded':>13} {'start to server (s)':>20} {'peak RSS (MB)':>14}")
    for i, result in enumerate(runs):
        print(f"{i:>4} {result['torch_loaded']!s:>13} {result['start_to_server_s']:>20.2f} {result['peak_rss_mb']:>14.0f}")
    summary = {
        "start_to_server_s_median": statistics.median(r["start_to_server_s"] for r in runs),
        "peak_rss_mb_median": statistics.median(r["peak_rss_mb"] for r in runs),
        "torch_loaded": any(r["torch_loaded"] for r in runs),
    }
    write_json(args.out, {"benchmark": "gateway_footprint", "command": command(args), "machine": machine(), "runs": runs, **summary})
    return 0


def _probe_in_a_fresh_process(model: Path) -> dict:
    probe = [sys.executable, "-m", "benchmarks.suites.gateway_footprint", str(model)]
    result = subprocess.run(probe, cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def _probe(model: str) -> None:
    """In the fresh process: run the serve command, and report where it would start the server."""
    import resource
    import time

    started = time.perf_counter()
    import services.gateway.server as server
    from services.cli.main import main as tessera

    def report(*args, **kwargs) -> None:
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        result = {"torch_loaded": "torch" in sys.modules, "start_to_server_s": time.perf_counter() - started, "peak_rss_mb": peak_mb}
        print(json.dumps(result))

    server.run_gateway = report
    tessera(["serve", "--role", "gateway", "--model", model, "--index-url", "redis://127.0.0.1:1"])


if __name__ == "__main__":
    _probe(sys.argv[1])
