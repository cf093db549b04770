"""A cluster simulator: the real router and the real index (embedded Valkey), with each role's
compute modelled on a virtual clock (benchmarks/simulate/: what is modelled and why).

    tessera bench --suite simulate                      # 64,128,256,512 nodes, three policies
    tessera bench --suite simulate --quick              # 6 and 12 nodes, a few requests (seconds)
    tessera bench --suite simulate --nodes 512 --policies cache_aware --requests-per-node 20

Per node count and policy (cache_aware: Tessera's router with the index; round_robin: the router
without cache lookups; llmd: an llm-d-style per-pod LRU prefix scorer), a fresh Valkey serves
multi-turn sessions about Zipf-popular images, with nodes joining, killed and drained during the
run. The workload scales with the node count (sessions and image catalogue per node) at the same
load per node. Reports tower runs per distinct image, prefill tokens per novel token, hit rates,
modelled TTFT p50/p99, router decision p50/p99 (wall clock), index commands and bytes per
request (server counters, all index traffic), a lookup's own server work (replayed alone),
index memory per million cached entries, how each grows from the smallest to the largest node
count, and the simulation's goals. Prints tables and writes JSON (default benchmarks/results/simulate.json).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path

from benchmarks.simulate import report
from benchmarks.simulate.cluster import Capacities, Costs
from benchmarks.simulate.run import POLICIES, RunConfig, simulate
from benchmarks.simulate.workload import WorkloadConfig
from benchmarks.suites.common import RESULTS, command, machine, usage_error, write_json
from benchmarks.suites.router import embedded_valkey
from services.router.scoring import ENCODE_DISPATCHES

QUICK = {"nodes": "6,12", "requests_per_node": 3.0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    costs, capacities = Costs(), Capacities()
    parser.add_argument("--nodes", default="64,128,256,512", help="comma-separated cluster sizes (nodes of all roles)")
    parser.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated, of {', '.join(POLICIES)}")
    parser.add_argument(
        "--quick", action="store_true", help=f"a short run: --nodes {QUICK['nodes']}, {QUICK['requests_per_node']:g} requests per node"
    )
    parser.add_argument(
        "--requests-per-node", type=float, default=12.0, help="turns per node over the run (the workload scales with nodes)"
    )
    parser.add_argument("--rate-per-node", type=float, default=0.5, help="offered turns per virtual second per node")
    parser.add_argument("--images-per-node", type=float, default=10.0, help="image catalogue size per node")
    parser.add_argument("--zipf-s", type=float, default=1.0, help="Zipf exponent of image popularity")
    parser.add_argument("--max-turns", type=int, default=4, help="turns per session: uniform in 1..N")
    parser.add_argument("--think-s", type=float, default=2.0, help="mean pause between a reply and the next turn")
    parser.add_argument("--system-tokens", type=int, default=15, help="shared chat-template tokens before the first image")
    parser.add_argument("--new-image-p", type=float, default=0.25, help="chance a later turn brings another image")
    parser.add_argument("--churn", type=float, default=0.03, help="joins, kills and drains, each, as a fraction of the nodes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--encode-s", type=float, default=costs.encode_s_per_image, help="tower seconds per image (small model)")
    parser.add_argument("--prefill-s-per-token", type=float, default=costs.prefill_s_per_token)
    parser.add_argument("--decode-step-s", type=float, default=costs.decode_step_s, help="decode step: this + per-seq * batch")
    parser.add_argument("--decode-step-s-per-seq", type=float, default=costs.decode_step_s_per_seq)
    parser.add_argument("--kv-blocks", type=int, default=capacities.kv_blocks, help="KV cache blocks per prefill or decode node")
    parser.add_argument("--cache-images", type=int, default=capacities.images, help="embeddings cached per encoder or prefill node")
    parser.add_argument("--llmd-lru-blocks", type=int, default=capacities.kv_blocks, help="the llm-d scorer's LRU capacity per pod")
    parser.add_argument("--encode-dispatch", default="adaptive", choices=ENCODE_DISPATCHES)
    parser.add_argument("--index-url", default=None, help="default: a fresh embedded Valkey per run (a URL's server is shared by the runs)")
    parser.add_argument("--out", type=Path, default=RESULTS / "simulate.json")


def configs(args: argparse.Namespace) -> list[RunConfig]:
    nodes_text, per_node = (QUICK["nodes"], QUICK["requests_per_node"]) if args.quick else (args.nodes, args.requests_per_node)
    costs = Costs(args.encode_s, args.prefill_s_per_token, args.decode_step_s, args.decode_step_s_per_seq)
    capacities = Capacities(args.kv_blocks, args.cache_images)
    mean_turns = (1 + args.max_turns) / 2
    out = []
    for nodes in (int(n) for n in nodes_text.split(",")):
        workload = WorkloadConfig(
            sessions=max(1, round(per_node * nodes / mean_turns)),
            catalogue=max(1, round(args.images_per_node * nodes)),
            session_rate=args.rate_per_node * nodes / mean_turns,
            zipf_s=args.zipf_s,
            max_turns=args.max_turns,
            think_s=args.think_s,
            system_tokens=args.system_tokens,
            new_image_p=args.new_image_p,
            seed=args.seed,
        )
        for policy in args.policies.split(","):
            out.append(
                RunConfig(
                    policy,
                    nodes,
                    workload,
                    costs,
                    capacities,
                    churn=args.churn,
                    encode_dispatch=args.encode_dispatch,
                    llmd_lru_blocks=args.llmd_lru_blocks,
                )
            )
    return out


def run(args: argparse.Namespace) -> int:
    unknown = set(args.policies.split(",")) - set(POLICIES)
    if unknown:
        return usage_error(args, f"unknown policies {', '.join(sorted(unknown))}; choose from {', '.join(POLICIES)}")
    try:
        runs = configs(args)
        for config in runs:
            if config.nodes < 3:
                raise ValueError("a cluster needs at least 3 nodes (one per role)")
    except ValueError as exc:
        return usage_error(args, str(exc))
    results = []
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    for config in runs:
        with _index(args.index_url) as url:
            result = simulate(config, url)
        results.append(result)
        print(f"{config.policy} at {config.nodes} nodes: {result['requests']} requests in {result['wall_s']:.1f} s wall", flush=True)
    print(report.table(results))
    grown = report.growth(results)
    if grown:
        print(report.growth_table(grown))
    checked = report.goals(results)
    if checked:
        print(report.goals_lines(checked))
    settings = {k: v for k, v in vars(args).items() if k not in ("suite", "suite_argv", "out")}
    out = {
        "benchmark": "simulate",
        "command": command(args),
        "machine": machine(load_avg_1m_before=load_before, load_avg_1m_after=os.getloadavg()[0]),
        "settings": settings,
        "wall_s": time.perf_counter() - started,
        "results": results,
        "growth": grown,
        "goals": checked,
    }
    write_json(args.out, out)
    return 0


@contextlib.contextmanager
def _index(url: str | None):
    if url:
        yield url
    else:
        with embedded_valkey() as embedded:
            yield embedded
