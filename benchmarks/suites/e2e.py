"""End-to-end latency: the disaggregated stack (over HTTP) against the single-process engine, on
the same requests, cold (new image) and cached (repeat).

    tessera bench --suite e2e --model small            # starts `tessera serve` itself
    tessera bench --suite e2e --endpoint http://host:8000/v1 --served-model NAME
                                                        # any OpenAI-compatible server (vLLM)
The requests are ``tessera bench``'s cold_images workload (one new image each), sent one at a
time by its runner (streamed, ``--max-tokens`` forced tokens); cached is the same requests again.
Prints a table and writes JSON (default benchmarks/results/e2e.json).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

from benchmarks.suites.common import RESULTS, command, image_size, machine, write_json
from services.bench import targets
from services.bench.runner import Endpoint, RunSettings, run_workload
from services.bench.workloads import BenchRequest, WorkloadSpec, build_workload

MEASURED_SEED, WARMUP_SEED = 0, 7  # the warm-up's image is never one of the measured ones


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="small")
    parser.add_argument("--endpoint", default=None, help="benchmark this OpenAI-compatible endpoint instead of starting tessera")
    parser.add_argument("--served-model", default=None)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--image-size", default="448x448")
    parser.add_argument("--skip-engine", action="store_true", help="do not measure the single-process engine")
    parser.add_argument("--out", type=Path, default=RESULTS / "e2e.json")


def run(args: argparse.Namespace) -> int:
    rows = measure_http(args)
    if not args.skip_engine:
        measure_engine(args, rows)
    print_table(args, rows)
    write_json(args.out, {"benchmark": "e2e", "command": command(args), "machine": machine(), "results": rows})
    return 0


def _requests(args, num_requests: int, seed: int) -> list[BenchRequest]:
    return build_workload("cold_images", WorkloadSpec(num_requests, image_size(args.image_size), seed))


def _latencies(endpoint: Endpoint, requests: list[BenchRequest], max_tokens: int) -> list[float]:
    """Seconds per request, one request at a time; any failure ends the benchmark."""
    records, _ = asyncio.run(run_workload(requests, [endpoint], RunSettings(concurrency=1, max_tokens=max_tokens, progress=False)))
    failed = [r.error for r in records if r.error is not None]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(records)} requests failed; the first: {failed[0]}")
    return [r.end_s - r.start_s for r in records]


def measure_http(args) -> dict:
    """Cold then cached medians over HTTP, against ``--endpoint`` or a `tessera serve` started here."""
    if args.endpoint is None:
        target, served = targets.local_stack(args.model, []), args.model
    else:
        target, served = targets.endpoints([args.endpoint]), args.served_model or args.model
    with target as (url,):
        endpoint = Endpoint(url, served)
        _latencies(endpoint, _requests(args, 1, WARMUP_SEED), 2)
        requests = _requests(args, args.requests, MEASURED_SEED)
        http_cold = _latencies(endpoint, requests, args.max_tokens)
        http_cached = _latencies(endpoint, requests, args.max_tokens)
    return {
        "endpoint": url,
        "http_cold_median_s": statistics.median(http_cold),
        "http_cached_median_s": statistics.median(http_cached),
    }


def _time_engine(llm, request: BenchRequest, max_tokens: int) -> float:
    from services.engine.sampling_params import SamplingParams
    from services.gateway.frontend.prompt_wire import prompt_for_library

    started = time.perf_counter()
    llm.generate([prompt_for_library({"messages": request.messages})], SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return time.perf_counter() - started


def measure_engine(args, rows: dict) -> None:
    """The same requests on the single-process engine; medians and stack/engine ratios into ``rows``."""
    from services.engine.llm import LLM

    llm = LLM(args.model)
    _time_engine(llm, _requests(args, 1, WARMUP_SEED)[0], 2)
    requests = _requests(args, args.requests, MEASURED_SEED)
    engine_cold = [_time_engine(llm, r, args.max_tokens) for r in requests]
    engine_cached = [_time_engine(llm, r, args.max_tokens) for r in requests]
    rows.update(
        engine_cold_median_s=statistics.median(engine_cold),
        engine_cached_median_s=statistics.median(engine_cached),
        cold_ratio=rows["http_cold_median_s"] / statistics.median(engine_cold),
        cached_ratio=rows["http_cached_median_s"] / statistics.median(engine_cached),
    )


def print_table(args, rows: dict) -> None:
    print(f"model={args.model} requests={args.requests} max_tokens={args.max_tokens} image={args.image_size}")
    print(f"{'':<10} {'stack (s)':>10} {'engine (s)':>11} {'ratio':>7}")
    for kind in ("cold", "cached"):
        engine = rows.get(f"engine_{kind}_median_s")
        ratio = rows.get(f"{kind}_ratio")
        print(
            f"{kind:<10} {rows[f'http_{kind}_median_s']:>10.3f} {engine if engine is not None else float('nan'):>11.3f} "
            f"{ratio if ratio is not None else float('nan'):>7.2f}"
        )
