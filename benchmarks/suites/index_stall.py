"""A stalled index under load: the stack's Valkey is stopped (SIGSTOP) for a few seconds while
streams decode, on a real `tessera serve` stack.

    tessera bench --suite index_stall                      # tiny model, 40 streams, a 3 s stall
    tessera bench --suite index_stall --streams 40 --stall-s 3 --new-requests 8

Measured:
* streams already decoding: the longest gap between two chunks of one stream, during the stall
  (and one second after it) against the same many seconds just before it. An index the gateway
  waits on from its event loop stalls every stream; one it awaits delays only new routes;
* new requests sent during the stall, spread over it: time to first token, against the same
  number sent just before the stall;
* requests failed (goal 0).
Prints a table and writes JSON (default benchmarks/results/index_stall.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from openai import AsyncOpenAI

from benchmarks.suites.common import RESULTS, command, machine, ms, write_json
from services.bench.local_stack import start_stack, stop_stack
from services.bench.workloads import image_url, synthetic_image, user_turn


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--streams", type=int, default=40, help="streams decoding when the index stops")
    parser.add_argument("--stall-s", type=float, default=3.0)
    parser.add_argument("--new-requests", type=int, default=8, help="requests sent during the stall (and as many before it)")
    parser.add_argument("--max-tokens", type=int, default=768, help="long enough that every stream outlives the stall")
    parser.add_argument("--out", type=Path, default=RESULTS / "index_stall.json")


@dataclass(slots=True)
class Stream:
    sent_at: float
    chunk_times: list[float] = field(default_factory=list)
    error: str | None = None

    def ttft_s(self) -> float | None:
        return self.chunk_times[0] - self.sent_at if self.chunk_times else None

    def max_gap_s(self, start: float, end: float) -> float | None:
        """The longest gap between consecutive chunks that ends inside [start, end]."""
        gaps = [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:], strict=False) if start <= b <= end]
        return max(gaps) if gaps else None


async def _stream(client: AsyncOpenAI, model: str, messages: list[dict], max_tokens: int, record: Stream) -> None:
    try:
        chunks = await client.chat.completions.create(
            model=model, messages=messages, stream=True, temperature=0, max_tokens=max_tokens, extra_body={"ignore_eos": True}
        )
        async for chunk in chunks:
            if chunk.choices and chunk.choices[0].delta.content:
                record.chunk_times.append(time.monotonic())
    except Exception as exc:  # a failed request is counted, not fatal to the run
        record.error = f"{type(exc).__name__}: {exc}"


def _messages(seed: int) -> list[dict]:
    return user_turn(image_url(synthetic_image(112, 112, seed=seed)), f"Question {seed}: describe it.")


async def _spread(client, model: str, first_seed: int, num: int, over_s: float, max_tokens: int) -> list[tuple[Stream, asyncio.Task]]:
    """``num`` requests (a new image each), sent evenly over ``over_s`` seconds."""
    sent = []
    for i in range(num):
        record = Stream(time.monotonic())
        sent.append((record, asyncio.create_task(_stream(client, model, _messages(first_seed + i), max_tokens, record))))
        await asyncio.sleep(over_s / num)
    return sent


async def measure(url: str, model: str, valkey_pid: int, args) -> dict:
    client = AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
    await _stream(client, model, _messages(0), 8, Stream(time.monotonic()))  # warm-up
    streams = [Stream(time.monotonic()) for _ in range(args.streams)]
    tasks = [asyncio.create_task(_stream(client, model, _messages(1000 + i), args.max_tokens, s)) for i, s in enumerate(streams)]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not all(s.chunk_times or s.error for s in streams):
        await asyncio.sleep(0.05)
    before = await _spread(client, model, 2000, args.new_requests, args.stall_s, 16)
    stopped_at = time.monotonic()
    os.kill(valkey_pid, signal.SIGSTOP)
    try:
        during = await _spread(client, model, 3000, args.new_requests, args.stall_s, 16)
    finally:
        os.kill(valkey_pid, signal.SIGCONT)
    resumed_at = time.monotonic()
    await asyncio.gather(*tasks, *(t for _, t in before + during))
    window = resumed_at - stopped_at + 1.0
    return {
        "stall_s": resumed_at - stopped_at,
        "streams": _gaps(streams, stopped_at - window, stopped_at, stopped_at, stopped_at + window),
        "new_requests": {"before": _ttfts([r for r, _ in before]), "during": _ttfts([r for r, _ in during])},
        "num_failed": sum(r.error is not None for r in streams + [r for r, _ in before + during]),
        "errors": sorted({r.error for r in streams + [r for r, _ in before + during] if r.error})[:5],
    }


def _gaps(streams: list[Stream], b0: float, b1: float, d0: float, d1: float) -> dict:
    def summary(values: list[float]) -> dict:
        return {"median_ms": ms(statistics.median(values)), "max_ms": ms(max(values))} if values else {}

    before = [g for s in streams if (g := s.max_gap_s(b0, b1)) is not None]
    during = [g for s in streams if (g := s.max_gap_s(d0, d1)) is not None]
    still = sum(1 for s in streams if s.chunk_times and s.chunk_times[-1] > d1)
    return {"max_gap_before": summary(before), "max_gap_during": summary(during), "num_decoding_past_window": still}


def _ttfts(records: list[Stream]) -> dict:
    values = [t for r in records if (t := r.ttft_s()) is not None]
    return {"median_ms": ms(statistics.median(values)), "max_ms": ms(max(values))} if values else {}


def run(args) -> int:
    with tempfile.TemporaryDirectory(prefix="index-stall-") as workdir:
        state_file = Path(workdir) / "state.json"
        process, url = start_stack(args.model, ["--state-file", str(state_file), "--no-restart"], Path(workdir) / "stack.log")
        try:
            valkey_pid = _valkey_pid(state_file)
            result = asyncio.run(measure(url, args.model, valkey_pid, args))
        finally:
            stop_stack(process)
    result = {"command": command(args), "machine": machine(), "num_streams": args.streams, **result}
    _print(result)
    write_json(args.out, result)
    return 0 if result["num_failed"] == 0 else 1


def _valkey_pid(state_file: Path) -> int:
    """The stack's embedded Valkey, from the launcher's state file (written once it serves)."""
    for _ in range(600):
        if state_file.exists():
            return int(json.loads(state_file.read_text())["valkey"]["pid"])
        time.sleep(0.1)
    raise RuntimeError(f"the launcher wrote no state file at {state_file}")


def _print(result: dict) -> None:
    streams, new = result["streams"], result["new_requests"]
    print(f"index stopped for {result['stall_s']:.2f} s under {result['num_streams']} streams; failed: {result['num_failed']}")
    print(f"{'':34}{'before':>12}{'during':>12}")
    for label, key in (("stream's longest gap, median (ms)", "median_ms"), ("stream's longest gap, max (ms)", "max_ms")):
        print(f"{label:34}{_fmt(streams['max_gap_before'].get(key)):>12}{_fmt(streams['max_gap_during'].get(key)):>12}")
    for label, key in (("new request TTFT, median (ms)", "median_ms"), ("new request TTFT, max (ms)", "max_ms")):
        print(f"{label:34}{_fmt(new['before'].get(key)):>12}{_fmt(new['during'].get(key)):>12}")
    print(f"streams still decoding after the window: {streams['num_decoding_past_window']}")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"
