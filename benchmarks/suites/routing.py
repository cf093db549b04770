"""Routing policies on a shared-image workload: a fresh 2-encoder/2-prefill/2-decode stack per
policy (cache_aware, then round_robin), each serving the same N images x Q questions, interleaved
(every round asks one question of every image, in a shuffled order; fixed seed: ``tessera bench``'s
shared_images workload), from C concurrent streaming clients (its runner: temperature 0, ignore_eos).

    tessera bench --suite routing --model small              # starts `tessera serve` per policy
    tessera bench --suite routing --model tiny --images 4 --questions 2 --out /tmp/routing.json
    tessera bench --suite routing --endpoint http://host:8000/v1 --served-model NAME
                                                              # any OpenAI-compatible server (vLLM)
Client side: TTFT (first streamed content chunk) p50/p99, latency p50, throughput. Server side,
deltas of the gateway's /metrics over the run (counters summed over roles): encoder runs per
distinct image, prefill tokens computed per prompt token, prefix-cached tokens, KV blocks pulled
from peers. round_robin is the classic baseline without the index (--baseline-index off, the
default: `--cache-lookups false`, the index then serves membership only). Also the router decision
time for a 4096-token prompt against an embedded Valkey (``tessera bench --suite router``). With
--endpoint only the client-side numbers are reported.
Prints a table and writes JSON (default benchmarks/results/routing.json).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.suites.common import RESULTS, command, image_size, machine, ms, write_json
from benchmarks.suites.router import decision_times, embedded_valkey
from services.bench.local_stack import scrape_metrics, start_stack, stop_stack
from services.bench.report import percentile
from services.bench.runner import Endpoint, RequestRecord, RunSettings, run_workload
from services.bench.workloads import BenchRequest, WorkloadSpec, build_workload, shared_images
from services.router.policies import SERVED_POLICIES as KNOWN_POLICIES

POLICIES = ("cache_aware", "round_robin")
WARMUP_SEED = 9  # cold_images of another seed: none of the workload's images
COUNTERS = {  # result key -> gateway /metrics counter
    "encoder_runs": "tessera_encoder_items_encoded_total",
    "prefill_tokens_computed": "tessera_prefill_tokens_computed_total",
    "prefix_cached_tokens": "tessera_prefix_cached_tokens_total",
    "kv_blocks_pulled": "tessera_prefill_kv_blocks_pulled_total",
}


# -- server counters --------------------------------------------------------------------------
def server_summary(before: dict[str, float], after: dict[str, float], num_images: int, prompt_tokens: int) -> dict:
    deltas = {key: after[name] - before.get(name, 0.0) for key, name in COUNTERS.items() if name in after}
    result = dict(deltas)
    if "encoder_runs" in deltas:
        result["encoder_runs_per_image"] = deltas["encoder_runs"] / num_images
    if "prefill_tokens_computed" in deltas and prompt_tokens:
        result["prefill_computed_per_prompt_token"] = deltas["prefill_tokens_computed"] / prompt_tokens
    return result


# -- stack ------------------------------------------------------------------------------------
def start_policy_stack(model: str, policy: str, use_index: bool, log_path: Path, timeout_s: float) -> tuple[subprocess.Popen, str]:
    """``tessera serve`` 2/2/2 with ``policy``; (launcher process, /v1 URL) once /health is 200."""
    extra = ["--encoders", "2", "--prefill", "2", "--decode", "2", "--routing-policy", policy]
    return start_stack(model, [*extra, *([] if use_index else ["--cache-lookups", "false"])], log_path, timeout_s)


# -- one measured configuration ---------------------------------------------------------------
def workload(args) -> list[BenchRequest]:
    """``--images`` images x ``--questions`` questions, interleaved: the shared_images workload."""
    return shared_images(WorkloadSpec(args.images * args.questions, image_size(args.image_size), args.seed), num_images=args.images)


def warmup(args) -> list[BenchRequest]:
    """Images not in the workload, so the measured run starts with cold caches for its images."""
    return build_workload("cold_images", WorkloadSpec(args.warmup, image_size(args.image_size), WARMUP_SEED))


def measure(base_url: str, model: str, requests: list[BenchRequest], args, *, with_counters: bool) -> dict:
    endpoints = [Endpoint(base_url, model)]
    settings = RunSettings(concurrency=args.concurrency, max_tokens=args.max_tokens, timeout_s=args.request_timeout_s, progress=False)
    warm, _ = asyncio.run(run_workload(warmup(args), endpoints, RunSettings(concurrency=1, max_tokens=2, timeout_s=settings.timeout_s)))
    failed = next((r.error for r in warm if r.error is not None), None)
    if failed is not None:
        raise RuntimeError(f"warm-up request failed: {failed}")
    before = scrape_metrics(base_url) if with_counters else {}
    records, wall = asyncio.run(run_workload(requests, endpoints, dataclasses.replace(settings, deadline_s=args.run_timeout_s)))
    after = scrape_metrics(base_url) if with_counters else {}
    result = client_summary(records, wall)
    if with_counters:
        result.update(server_summary(before, after, args.images, result["prompt_tokens"]))
    return result


def client_summary(records: list[RequestRecord], wall_s: float) -> dict:
    ok = [r for r in records if r.error is None]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    errors = [r.error for r in records if r.error is not None]
    return {
        "requests": len(records),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "ttft_p50_ms": ms(percentile(ttfts, 0.50)),
        "ttft_p99_ms": ms(percentile(ttfts, 0.99)),
        "latency_p50_ms": ms(percentile([r.end_s - r.start_s for r in ok if r.end_s is not None], 0.50)),
        "wall_s": wall_s,
        "requests_per_s": len(ok) / wall_s,
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "output_tokens": sum(r.num_tokens for r in ok),
        "output_tokens_per_s": sum(r.num_tokens for r in ok) / wall_s,
    }


def run_policy(policy: str, requests: list[BenchRequest], args, log_dir: Path) -> dict:
    use_index = policy != "round_robin" or args.baseline_index == "on"
    log_path = log_dir / f"{policy}.log"
    print(f"[{policy}] starting 2/2/2 stack (model {args.model}, index {'on' if use_index else 'off'}); log {log_path}", flush=True)
    process, base_url = start_policy_stack(args.model, policy, use_index, log_path, args.start_timeout_s)
    try:
        result = measure(base_url, args.model, requests, args, with_counters=True)
    finally:
        stop_stack(process)
    return {"policy": policy, "index": use_index, **result}


def router_decision(decisions: int, prompt_tokens: int = 4096) -> dict:
    with embedded_valkey() as url:
        result = decision_times(url, prompt_tokens, decisions, 16)
    # As deployed, preprocess sends the block hashes with the tokens, so the router's decision is
    # the index lookup plus scoring ("hashes_given"); the other figure includes hashing 4k tokens.
    given = result["hashes_given"]
    return {
        "prompt_tokens": prompt_tokens,
        "decisions": decisions,
        "p50_ms": given["p50_ms"],
        "p99_ms": given["p99_ms"],
        "with_hashing_p50_ms": result["p50_ms"],
        "with_hashing_p99_ms": result["p99_ms"],
    }


# -- report -----------------------------------------------------------------------------------
COLUMNS = [  # header, result key, width, format spec
    ("policy", "policy", 12, ""),
    ("index", "index", 5, ""),
    ("ttft p50 ms", "ttft_p50_ms", 11, ".1f"),
    ("ttft p99 ms", "ttft_p99_ms", 11, ".1f"),
    ("lat p50 ms", "latency_p50_ms", 10, ".1f"),
    ("req/s", "requests_per_s", 6, ".2f"),
    ("tok/s", "output_tokens_per_s", 7, ".1f"),
    ("enc/img", "encoder_runs_per_image", 7, ".2f"),
    ("prefill/prompt", "prefill_computed_per_prompt_token", 14, ".3f"),
    ("cached tok", "prefix_cached_tokens", 10, ".0f"),
    ("kv pulled", "kv_blocks_pulled", 9, ".0f"),
    ("errors", "errors", 6, ""),
]


def _cell(value, width: int, spec: str) -> str:
    if value is None:
        return f"{'-':>{width}}"
    return f"{value:>{width}{spec}}" if spec else f"{value!s:>{width}}"


def print_table(rows: list[dict], summary: dict) -> None:
    print(" ".join(f"{header:>{width}}" for header, _, width, _ in COLUMNS))
    for row in rows:
        print(" ".join(_cell(row.get(key), width, spec) for _, key, width, spec in COLUMNS))
    if summary.get("ttft_p50_ratio_round_robin_over_cache_aware") is not None:
        print(f"TTFT p50 round_robin / cache_aware: {summary['ttft_p50_ratio_round_robin_over_cache_aware']:.2f}")
    router = summary.get("router_decision")
    if router:
        print(
            f"router decision ({router['prompt_tokens']}-token prompt, embedded Valkey, block hashes from preprocess): "
            f"p50 {router['p50_ms']:.3f} ms, p99 {router['p99_ms']:.3f} ms "
            f"(hashing in the router too: p50 {router['with_hashing_p50_ms']:.3f} ms, p99 {router['with_hashing_p99_ms']:.3f} ms)"
        )


def _ratio(rows: list[dict]) -> float | None:
    by_policy = {row.get("policy"): row.get("ttft_p50_ms") for row in rows}
    if by_policy.get("round_robin") and by_policy.get("cache_aware"):
        return by_policy["round_robin"] / by_policy["cache_aware"]
    return None


def policy_list(text: str) -> list[str]:
    policies = [p.strip() for p in text.split(",") if p.strip()]
    if not policies or any(p not in KNOWN_POLICIES for p in policies):
        raise argparse.ArgumentTypeError(f"choose from {', '.join(KNOWN_POLICIES)}")
    return policies


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="small", help="tiny, small, or a checkpoint directory")
    parser.add_argument("--endpoint", default=None, help="benchmark this OpenAI-compatible endpoint instead of starting tessera")
    parser.add_argument("--served-model", default=None, help="model name to send with --endpoint (default: --model)")
    parser.add_argument(
        "--policies", type=policy_list, default=list(POLICIES), help="comma-separated routing policies, each on a fresh stack"
    )
    parser.add_argument(
        "--baseline-index",
        choices=("on", "off"),
        default="off",
        help="run round_robin with the Valkey index (default off: --cache-lookups false)",
    )
    parser.add_argument("--images", type=int, default=12, help="distinct images")
    parser.add_argument("--questions", type=int, default=4, help="questions per image")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight at once")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--image-size", default="448x448")
    parser.add_argument("--seed", type=int, default=7, help="seed of the images and the interleaved order")
    parser.add_argument("--warmup", type=int, default=4, help="unmeasured requests (other images) before each run")
    parser.add_argument("--router-decisions", type=int, default=2000, help="router decisions to time (0: skip)")
    parser.add_argument("--request-timeout-s", type=float, default=300)
    parser.add_argument("--run-timeout-s", type=float, default=1800, help="deadline for one policy's whole workload")
    parser.add_argument("--start-timeout-s", type=float, default=600)
    parser.add_argument("--log-dir", type=Path, default=None, help="stack logs (default: a new temporary directory)")
    parser.add_argument("--out", type=Path, default=RESULTS / "routing.json")


def write_result(args, served: str, rows: list[dict], summary: dict, load_at_start: float) -> None:
    workload_info = {
        "images": args.images,
        "questions": args.questions,
        "requests": args.images * args.questions,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "image_size": args.image_size,
        "seed": args.seed,
        "warmup": args.warmup,
    }
    result = {
        "benchmark": "routing",
        "command": command(args),
        "machine": machine(load_avg_1m_start=load_at_start, load_avg_1m_end=os.getloadavg()[0]),
        "model": served,
        "endpoint": args.endpoint,
        "baseline_index": args.baseline_index,
        "workload": workload_info,
        "results": rows,
        **summary,
    }
    write_json(args.out, result)


def warn_failures(rows: list[dict]) -> bool:
    failed = [row for row in rows if row["errors"]]
    for row in failed:
        print(
            f"WARNING {row['policy']}: {row['errors']} of {row['requests']} requests failed (first: {row['first_error']}); "
            "their TTFT/latency are left out and the wall time includes them",
            file=sys.stderr,
        )
    return bool(failed)


def run(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: stacks are stopped
    # Started in the background by a script, SIGINT comes ignored and the launcher would inherit
    # that (and ignore our Ctrl-C while it starts); a handler here is reset to the default on exec.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    load_at_start = os.getloadavg()[0]
    requests = workload(args)
    router = router_decision(args.router_decisions) if args.router_decisions > 0 else None
    if args.endpoint is None:
        served = args.model
        log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="routing-bench-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        rows = [run_policy(policy, requests, args, log_dir) for policy in args.policies]
    else:
        served = args.served_model or args.model
        rows = [
            {
                "policy": "endpoint",
                "index": None,
                "endpoint": args.endpoint,
                **measure(args.endpoint, served, requests, args, with_counters=False),
            }
        ]
    summary = {"ttft_p50_ratio_round_robin_over_cache_aware": _ratio(rows), "router_decision": router}
    print(
        f"model={served} images={args.images} questions={args.questions} concurrency={args.concurrency} "
        f"max_tokens={args.max_tokens} image={args.image_size} baseline_index={args.baseline_index}"
    )
    print_table(rows, summary)
    write_result(args, served, rows, summary, load_at_start)
    return 1 if warn_failures(rows) else 0
