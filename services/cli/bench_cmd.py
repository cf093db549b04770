"""``tessera bench``: run a named workload against the local stack (started for the run) or any
OpenAI-compatible endpoint(s), print a summary table, and write JSON plus a PNG figure; or put
earlier runs side by side with ``--compare``.

    tessera bench --workload shared_images --requests 32 --concurrency 4
    tessera bench --workload cold_images --base-url http://127.0.0.1:8100/v1 --label vllm
    tessera bench --compare runs/tessera.json runs/vllm.json --out runs/compare
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import time
from pathlib import Path

from services.bench import cache_rates, plots, report
from services.bench.runner import Endpoint, RunSettings, run_workload, served_model
from services.bench.workloads import WORKLOADS, WorkloadSpec, build_workload


def register(subparsers: argparse._SubParsersAction) -> None:
    cmd = subparsers.add_parser("bench", help="benchmark a workload against the local stack or OpenAI-compatible endpoints")
    cmd.add_argument("--workload", choices=[*WORKLOADS, "all"], default="shared_images")
    cmd.add_argument("--requests", type=int, default=32, help="requests per workload")
    cmd.add_argument("--concurrency", type=int, default=4, help="requests in flight at once")
    cmd.add_argument("--max-tokens", type=int, default=16, help="output tokens per request (forced with ignore_eos)")
    cmd.add_argument("--image-size", default="448x448", help="WxH of the workload's images")
    cmd.add_argument("--seed", type=int, default=0)
    cmd.add_argument(
        "--base-url", action="append", default=[], help="an endpoint's /v1 URL (repeat for round-robin); none: start tessera serve"
    )
    cmd.add_argument("--model", default="tiny", help="the model to serve when starting the local stack")
    cmd.add_argument("--serve-args", default="", help='extra `tessera serve` arguments for the local stack, e.g. "--encoders 2"')
    cmd.add_argument("--label", default=None, help="this run's name in tables and figures (default: tessera or the URL)")
    cmd.add_argument("--out", type=Path, default=Path("benchmarks/results/bench"), help="directory for JSON and PNG files")
    cmd.add_argument("--no-progress", action="store_true", help="no progress bar")
    cmd.add_argument("--compare", nargs=2, type=Path, metavar=("RUN_A", "RUN_B"), help="compare two run JSON files instead of running")
    cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.compare:
        runs = [report.load(path) for path in args.compare]
        print(report.table(runs))
        print(f"figure: {plots.plot(runs, args.out / 'compare.png')}")
        return 0
    width, height = (int(v) for v in args.image_size.lower().split("x"))
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    settings = RunSettings(concurrency=args.concurrency, max_tokens=args.max_tokens, progress=not args.no_progress)
    stack = None
    base_urls = list(args.base_url)
    if not base_urls:
        from services.bench.local_stack import start_stack

        stack, url = start_stack(args.model, shlex.split(args.serve_args))
        base_urls = [url]
    try:
        endpoints = [Endpoint(url, asyncio.run(served_model(url))) for url in base_urls]
        label = args.label or ("tessera" if stack is not None else ", ".join(base_urls))
        for name in names:
            requests = build_workload(name, WorkloadSpec(args.requests, (width, height), args.seed))
            before = {url: cache_rates.scrape(url) for url in base_urls}
            records, wall_s = asyncio.run(run_workload(requests, endpoints, settings))
            rates = cache_rates.hit_rates(_summed(before.values()), _summed(cache_rates.scrape(url) for url in base_urls))
            result = report.Run(label, name, _settings_json(args, base_urls), wall_s, records, rates)
            stem = args.out / f"{name}-{label.replace('/', '_').replace(':', '_')}-{time.strftime('%Y%m%d-%H%M%S')}"
            report.save(result, stem.with_suffix(".json"))
            print(f"\n{name} ({len(requests)} requests, concurrency {args.concurrency})")
            print(report.table([result]))
            print(f"json: {stem.with_suffix('.json')}\nfigure: {plots.plot([result], stem.with_suffix('.png'))}")
    finally:
        if stack is not None:
            from services.bench.local_stack import stop_stack

            stop_stack(stack)
    return 0


def _summed(scrapes) -> cache_rates.Counters:
    total: cache_rates.Counters = {}
    for counters in scrapes:
        for name, value in counters.items():
            total[name] = total.get(name, 0.0) + value
    return total


def _settings_json(args: argparse.Namespace, base_urls: list[str]) -> dict:
    keys = ("requests", "concurrency", "max_tokens", "image_size", "seed", "model", "serve_args")
    return {"base_urls": base_urls, **{key: getattr(args, key) for key in keys}}
