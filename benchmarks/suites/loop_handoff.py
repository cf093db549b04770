"""Outputs handed from an engine thread to the asyncio loop that streams them: one
``call_soon_threadsafe`` per output, against ``LoopHandoff`` (shared/loop_handoff.py), which
wakes the loop once per burst. A stand-in engine thread holds the GIL for a step's work, then
hands one output per request to a consumer task per request, as a decode step does. Reported:
process CPU per output, median of the repeats. Prints a table, writes JSON.

    tessera bench --suite loop_handoff --requests 256 --steps 200
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import threading
from pathlib import Path

from benchmarks.suites.common import RESULTS, command, machine, write_json
from shared.loop_handoff import LoopHandoff

MODES = ("call_soon_threadsafe", "loop_handoff")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=256, help="outputs per step (a decode batch)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-work", type=int, default=20000, help="loop iterations of GIL-holding work per step")
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode; the median is reported")
    parser.add_argument("--out", type=Path, default=RESULTS / "loop_handoff.json")


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _one_run(mode: str, args: argparse.Namespace) -> float:
    """Process CPU seconds for ``args.steps`` steps of ``args.requests`` outputs each."""
    loop = asyncio.get_running_loop()
    queues: list[asyncio.Queue] = [asyncio.Queue() for _ in range(args.requests)]
    # Both take (callback, argument): the only difference is how often the loop is woken.
    post = loop.call_soon_threadsafe if mode == "call_soon_threadsafe" else LoopHandoff(loop).call

    async def consume(queue: asyncio.Queue) -> None:
        for _ in range(args.steps):
            await queue.get()

    def engine() -> None:
        for step in range(args.steps):
            total = 0
            for i in range(args.step_work):
                total += i
            for queue in queues:
                post(queue.put_nowait, step)

    started = _cpu_s()
    consumers = [loop.create_task(consume(queue)) for queue in queues]
    thread = threading.Thread(target=engine, name="engine")
    thread.start()
    await asyncio.gather(*consumers)
    thread.join()
    return _cpu_s() - started


def run(args: argparse.Namespace) -> int:
    mode_to_runs: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(args.repeats):
        for mode in MODES:  # interleaved, so a drift in the machine's speed falls on both
            mode_to_runs[mode].append(asyncio.run(_one_run(mode, args)))
    num_outputs = args.requests * args.steps
    rows = [
        {"mode": mode, "cpu_s": statistics.median(runs), "cpu_us_per_output": statistics.median(runs) / num_outputs * 1e6}
        for mode, runs in mode_to_runs.items()
    ]
    print(f"{'mode':<22}  {'CPU s':>7}  {'us per output':>13}   ({args.requests} outputs x {args.steps} steps)")
    for row in rows:
        print(f"{row['mode']:<22}  {row['cpu_s']:7.3f}  {row['cpu_us_per_output']:13.2f}")
    write_json(args.out, {"benchmark": "loop_handoff", "command": command(args), "machine": machine(), "results": rows})
    return 0
