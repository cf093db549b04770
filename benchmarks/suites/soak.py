"""Soak: minutes of mixed traffic over a stack with two nodes of every role; does memory stay flat
and every cache within its budget?

    tessera bench --suite soak                               # 10 minutes, tiny model, 6 clients
    tessera bench --suite soak --minutes 1.5 --seed 3        # a short check
    TESSERA_INTERNAL_SECRET=... tessera bench --suite soak --base-url http://127.0.0.1:8000/v1 --state-file STATE.json

Without --base-url it starts ``tessera serve --preprocess 2 --encoders 2 --prefill 2 --decode 2
--state-file ...`` with small cache budgets (so the caches reach their budgets, and evict, inside
the warm-up; what grows after that is a leak, not a cache filling up). Traffic
(soak_traffic.py beside this module): new images, repeated images, multi-turn chats, streams cancelled
mid-way and bad requests from ``--concurrency`` async clients. Every ``--sample-interval-s`` it
records the RSS of every stack process and every node's cache occupancy against its budget
(soak_monitor.py); against a running stack, export the TESSERA_INTERNAL_SECRET it was
started with, so the nodes answer the Stats calls that read their caches.

Prints RSS growth per process from the end of the warm-up (the first 20% of the run) to the end
(goal: < 5%), every cache's peak occupancy against its budget, requests by kind, the success rate
with bad requests excluded (goal: 100%) and the share of bad requests answered with a 4xx (goal:
100%). Writes JSON and a PNG under benchmarks/results/soak/. Exits 1 when a goal is missed (also:
a stack process restarted, or KV blocks still held once the traffic has stopped), so automation
can gate on it. Not a test: it takes minutes and a whole machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import tempfile
import time
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

from benchmarks.suites import soak_report as report
from benchmarks.suites.common import RESULTS, command, machine, usage_error
from benchmarks.suites.soak_monitor import Monitor, Sample
from benchmarks.suites.soak_traffic import Outcome, TrafficConfig, run_traffic
from services.bench.local_stack import scrape_metrics, start_stack, stop_stack
from services.bench.portable import write_json
from services.bench.runner import served_model
from services.transport.internal_auth import SECRET_ENV

NODES_PER_ROLE = ["--preprocess", "2", "--encoders", "2", "--prefill", "2", "--decode", "2"]
SETTLE_S = 5.0  # after the traffic: aborted streams free their blocks, the last sample is idle


def stack_flags(args: argparse.Namespace, state_file: Path) -> list[str]:
    caches = ["--processor-cache-bytes", str(args.processor_cache_mib * 1024 * 1024), "--num-kv-blocks", str(args.num_kv_blocks)]
    caches += ["--max-prompt-tokens", str(args.max_prompt_tokens)]
    caches += ["--encoder-cache-tokens", str(args.encoder_cache_tokens), "--max-encoder-tokens-per-step", str(args.encoder_cache_tokens)]
    return [*NODES_PER_ROLE, "--state-file", str(state_file), *caches]


def wait_for_state(path: Path, timeout_s: float = 30.0) -> None:
    """The launcher writes the state file just after the gateway answers /health."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no state file at {path}")
        time.sleep(0.2)


def request_statuses(base_url: str) -> dict[str, float]:
    """The gateway's requests counter by HTTP status (``tessera_requests_total{status=...}``)."""
    metrics = scrape_metrics(base_url)
    prefix = 'tessera_requests_total{status="'
    return {name[len(prefix) : -2]: value for name, value in metrics.items() if name.startswith(prefix)}


def soak(
    args: argparse.Namespace, base_url: str, model: str, state_file: Path, launcher_pid: int | None
) -> tuple[list[Sample], list[Outcome], dict[str, float]]:
    """(samples, request outcomes, the gateway's responses by status over the run)."""
    duration_s = args.minutes * 60
    config = TrafficConfig(
        base_url=base_url,
        model=model,
        concurrency=args.concurrency,
        seed=args.seed,
        max_tokens=args.max_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
    )
    statuses_before = request_statuses(base_url)
    monitor = Monitor(state_file, launcher_pid, args.sample_interval_s, time.monotonic())
    monitor.start()
    try:
        outcomes = asyncio.run(run_traffic(config, duration_s, grace_s=args.grace_s))
        time.sleep(SETTLE_S)
    finally:
        monitor.stop()
    if monitor.num_sample_errors:
        print(f"{monitor.num_sample_errors} samples or Stats calls failed; the first: {monitor.first_sample_error}", flush=True)
    statuses_after = request_statuses(base_url)
    return monitor.samples, outcomes, {s: statuses_after[s] - statuses_before.get(s, 0.0) for s in statuses_after}


def analyse(args: argparse.Namespace, samples: list[Sample], outcomes: list[Outcome], gateway_statuses: dict[str, float]) -> dict:
    """Print the tables and the verdict; the result's JSON body."""
    warmup_end_s = report.warmup_s(args.minutes * 60)
    growth = report.process_growth(samples, warmup_end_s)
    peaks = report.cache_peaks(samples)
    traffic = report.summarize_traffic(outcomes)
    num_restarts = samples[-1].num_restarts if samples else 0
    missed = report.missed_goals(growth, peaks, traffic, num_restarts)
    if not peaks:
        missed.append("no cache occupancy could be read (is TESSERA_INTERNAL_SECRET the stack's?)")
    held = [p for p in peaks if p.name.endswith("/kv") and p.end_used > 0]
    missed += [f"{p.name}: {p.end_used:.0f} KV blocks still held {SETTLE_S:.0f} s after the traffic stopped" for p in held]
    print(f"\nmemory, warm-up {warmup_end_s:.0f} s of {args.minutes * 60:.0f} s:\n{report.growth_table(growth)}")
    print(f"\ncaches (peak over {len(samples)} samples, every {args.sample_interval_s:.0f} s):\n{report.cache_table(peaks)}")
    print(f"\nrequests:\n{report.traffic_table(traffic)}\n\n{report.bad_case_table(traffic)}\n")
    print(report.rate_line(traffic))
    print(f"gateway responses by status over the run: {json.dumps({s: int(n) for s, n in sorted(gateway_statuses.items()) if n})}")
    for kind, examples in report.failure_examples(outcomes).items():
        print(f"  failed {kind}: {examples}")
    print("\ngoals: " + ("all met" if not missed else "MISSED\n  " + "\n  ".join(missed)))
    return {
        "warmup_s": warmup_end_s,
        "processes": [{**asdict(g), "growth_pct": g.growth_pct} for g in growth],
        "caches": [{**asdict(p), "peak_fraction": p.peak_fraction, "within_budget": p.within_budget} for p in peaks],
        "requests": {
            "ok_by_kind": traffic.kind_to_num_ok,
            "failed_by_kind": traffic.kind_to_num_failed,
            "bad_statuses_by_case": traffic.bad_case_to_statuses,
            "success_rate_excluding_bad": traffic.success_rate,
            "bad_4xx_rate": traffic.bad_4xx_rate,
            "failure_examples": report.failure_examples(outcomes),
            "gateway_statuses": gateway_statuses,
        },
        "restarts": num_restarts,
        "missed_goals": missed,
        "samples": [
            {"t_s": round(s.t_s, 2), "rss_bytes": s.rss_bytes, "caches": {n: [u.used, u.capacity, u.unit] for n, u in s.caches.items()}}
            for s in samples
        ],
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=10.0, help="traffic duration; the first 20%% is warm-up")
    parser.add_argument("--concurrency", type=int, default=6, help="async clients sending at once")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="tiny", help="model to start (no --base-url)")
    parser.add_argument("--base-url", default=None, help="target a running stack's /v1 URL instead (needs --state-file)")
    parser.add_argument("--state-file", type=Path, default=None, help="that stack's `tessera serve --state-file` (pids, addresses)")
    parser.add_argument("--max-tokens", type=int, default=8, help="forced tokens per completed request")
    parser.add_argument("--sample-interval-s", type=float, default=5.0)
    parser.add_argument("--grace-s", type=float, default=120.0, help="how long requests still running at the end may take")
    # Small budgets (a started stack only), so that every cache fills and starts evicting early in
    # the run: growth after the warm-up is then a leak, not a cache still filling up.
    parser.add_argument("--processor-cache-mib", type=int, default=16, help="processor cache per preprocess node")
    parser.add_argument("--encoder-cache-tokens", type=int, default=1024, help="embedding rows per encoder and per prefill node")
    parser.add_argument("--num-kv-blocks", type=int, default=512, help="KV pool per prefill and decode node (prefix cache included)")
    # Tokenizing a prompt past the limit costs memory in proportion (~30 MB for 40k tokens), which
    # the allocator keeps as the preprocess node's high-water mark; 4096 keeps that small. With
    # --base-url, give the target's own limit.
    parser.add_argument("--max-prompt-tokens", type=int, default=4096, help="the stack's --max-prompt-tokens")
    parser.add_argument("--out", type=Path, default=RESULTS / "soak")


def run(args: argparse.Namespace) -> int:
    if args.base_url is not None and args.state_file is None:
        return usage_error(args, "--base-url needs --state-file: the soak reads every process's pid and address from it")
    started_at = datetime.now()
    stack = None
    if args.base_url is None:
        state_file = Path(tempfile.mkdtemp(prefix="tessera-soak-")) / "state.json"
        # The stack takes its internal secret from here (else it draws its own): the monitor's
        # Stats calls need it too.
        os.environ.setdefault(SECRET_ENV, secrets.token_urlsafe(32))
        log_path = RESULTS / "soak.log"  # ignored by git, like the other stack logs
        print(f"starting tessera serve --model {args.model} (2 nodes per role); log: {log_path}", flush=True)
        stack, base_url = start_stack(args.model, stack_flags(args, state_file), log_path=log_path)
        model = args.model
    else:
        state_file, base_url = args.state_file, args.base_url
        model = asyncio.run(served_model(base_url))
    try:
        wait_for_state(state_file)
        print(f"soaking {base_url} for {args.minutes:g} min with {args.concurrency} clients", flush=True)
        samples, outcomes, gateway_statuses = soak(args, base_url, model, state_file, stack.pid if stack is not None else None)
    finally:
        if stack is not None:
            stop_stack(stack)
    result = {
        "command": command(args),
        "started_at": started_at.isoformat(timespec="seconds"),
        "machine": machine(),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k not in ("suite", "suite_argv")},
        "stack_flags": stack_flags(args, state_file) if stack is not None else None,
        **analyse(args, samples, outcomes, gateway_statuses),
    }
    stem = f"soak-{model if stack is not None else 'endpoint'}-{args.minutes:g}min-{started_at:%Y%m%d-%H%M%S}"
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / f"{stem}.json", result, indent=1)
    title = f"soak: {args.minutes:g} min, {args.concurrency} clients, {model}"
    plot = report.write_plot(samples, result["warmup_s"], args.out / f"{stem}.png", title)
    print(f"wrote {args.out / f'{stem}.json'} and {plot}")
    return 1 if result["missed_goals"] else 0
