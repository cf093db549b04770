"""Where a stack's memory goes: every process of a `tessera serve` stack after some image requests.

    tessera bench --suite stack_memory                         # small, 1/1/1, 8 image requests
    tessera bench --suite stack_memory --checkout ../old-tree  # the same, served by another checkout

Per process (the launcher, Valkey and each role): RSS, PSS (shared pages split between the
processes mapping them) and its anonymous and file-backed parts, from /proc/PID/smaps_rollup,
after ``--requests`` chat requests with an image each (a new image every request, so every cache
path is taken). Prints a table and writes JSON (default benchmarks/results/stack-memory.json).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from openai import OpenAI

from benchmarks.suites.common import RESULTS, command, machine, write_json
from services.bench.local_stack import stop_stack, wait_healthy
from services.bench.workloads import image_url, synthetic_image, user_turn
from services.stack.node_process import free_port

ROOT = Path(__file__).resolve().parents[2]
FIELDS = ("Rss", "Pss", "Pss_Anon", "Pss_File", "Pss_Shmem", "Anonymous", "Swap")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="small")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the checkout whose `tessera serve` runs the stack")
    parser.add_argument("--out", type=Path, default=RESULTS / "stack-memory.json")


def memory_of(pid: int) -> dict[str, int]:
    """The process's smaps_rollup fields, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value, *_ = line.split()
        if name.rstrip(":") in FIELDS:
            out[name.rstrip(":")] = int(value) * 1024
    return out


def processes(launcher_pid: int) -> dict[str, int]:
    """The launcher and its descendants: a label (the role, or the program) -> pid."""
    labels = {"launcher": launcher_pid}
    frontier = [launcher_pid]
    for _ in range(4):  # launcher -> roles and Valkey -> their helpers: never deeper
        children = []
        for pid in frontier:
            children_file = Path(f"/proc/{pid}/task/{pid}/children")
            children += [int(c) for c in children_file.read_text().split()] if children_file.exists() else []
        for pid in children:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            args = [a.decode() for a in argv if a]
            role = args[args.index("--role") + 1] if "--role" in args else Path(args[0]).name
            labels[f"{role}" if role not in labels else f"{role}-{pid}"] = pid
        frontier = children
    return labels


def run(args) -> int:
    with tempfile.TemporaryDirectory(prefix="stack-memory-") as workdir:
        port = free_port()
        serve = [sys.executable, "-m", "services.cli.main", "serve", "--model", args.model, "--port", str(port)]
        log = open(Path(workdir) / "stack.log", "w")
        process = subprocess.Popen([*serve, "--generate-port", str(free_port())], cwd=args.checkout, stdout=log, stderr=log)
        try:
            wait_healthy(process, f"http://127.0.0.1:{port}", 900)
            client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=600)
            model = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30).json()["data"][0]["id"]
            for i in range(args.requests):
                messages = user_turn(image_url(synthetic_image(448, 448, seed=i)), f"Question {i}: describe it.")
                client.chat.completions.create(model=model, messages=messages, max_tokens=args.max_tokens, temperature=0)
            time.sleep(2)  # publishers flush, gauges settle
            per_process = {label: memory_of(pid) for label, pid in processes(process.pid).items()}
        finally:
            stop_stack(process)
            log.close()
    total = {field: sum(p.get(field, 0) for p in per_process.values()) for field in FIELDS}
    result = {"command": command(args), "machine": machine(), "checkout": str(args.checkout), "processes": per_process, "total": total}
    _print(per_process, total)
    write_json(args.out, result)
    return 0


def _print(per_process: dict[str, dict[str, int]], total: dict[str, int]) -> None:
    print(f"{'process':<14}" + "".join(f"{f:>12}" for f in FIELDS))
    for label, fields in [*sorted(per_process.items()), ("total", total)]:
        print(f"{label:<14}" + "".join(f"{fields.get(f, 0) / 2**20:>10.0f}Mi" for f in FIELDS))
