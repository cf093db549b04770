"""``tessera bench``'s run: a workload against targets, a comparison of result files, or a
suite (the arguments are in services/cli/bench_cmd.py)."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import shlex
import sys
import time
from pathlib import Path
from types import ModuleType

from services.bench import cache_rates, plots, report, serve_metrics, targets
from services.bench.arrivals import check_pacing
from services.bench.runner import Endpoint, RunSettings, run_workload, served_model
from services.bench.vllm_dataset import write_custom_image_dataset
from services.bench.workloads import WORKLOADS, WorkloadSpec, build_workload, image_size


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
    try:
        suites = find_suites()
    except SuitesUnavailableError as exc:
        print(f"tessera bench --suite: error: {exc}", file=sys.stderr)
        return 2
    if not argv or argv[0] not in suites.SUITES:
        named = f" (not {argv[0]!r})" if argv else ""
        print(f"tessera bench --suite: error: name one of {', '.join(suites.SUITES)}{named}", file=sys.stderr)
        return 2
    name, suite_argv = argv[0], argv[1:]
    args = suites.parser(name).parse_args(suite_argv)
    args.suite_argv = suite_argv
    return int(suites.load(name).run(args) or 0)


class SuitesUnavailableError(RuntimeError):
    pass


def find_suites(roots: tuple[Path, ...] | None = None) -> ModuleType:
    """The suites, which live in a checkout's benchmarks/ and are not installed: from the working
    directory's checkout, else from the checkout this package runs from (``roots``: where to look)."""
    for root in roots or (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (root / "benchmarks" / "suites" / "__init__.py").is_file():
            if str(root) not in sys.path:
                sys.path.insert(0, str(root))
            return importlib.import_module("benchmarks.suites")
    raise SuitesUnavailableError(
        "the benchmark suites live in a Tessera checkout's benchmarks/, which is not installed; "
        "run tessera bench --suite from a checkout (or python benchmarks/NAME_bench.py there)"
    )


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
            seconds = cache_rates.seconds_spent(scraped_before, scraped_after)
            num_new = sum(r.new_items for r in requests)
            result = report.Run(target.label, name, _settings_json(args, base_urls), wall_s, records, rates, tower_runs, num_new, seconds)
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
