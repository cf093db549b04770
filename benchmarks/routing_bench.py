"""Routing policies on a shared-image workload: a fresh 2-encoder/2-prefill/2-decode stack per
policy (cache_aware, then round_robin), each serving the same N images x Q questions, interleaved
(every round asks one question of every image, in a shuffled order; fixed seed), from C concurrent
streaming clients (official openai client, temperature 0, ignore_eos).

    python benchmarks/routing_bench.py --model small              # starts `tessera serve` per policy
    python benchmarks/routing_bench.py --model tiny --images 4 --questions 2 --out /tmp/routing.json
    python benchmarks/routing_bench.py --endpoint http://host:8000/v1 --served-model NAME
                                                                   # any OpenAI-compatible server (vLLM)
Client side: TTFT (first streamed content chunk) p50/p99, latency p50, throughput. Server side,
deltas of the gateway's /metrics over the run (counters summed over roles): encoder runs per
distinct image, prefill tokens computed per prompt token, prefix-cached tokens, KV blocks pulled
from peers. round_robin is the classic baseline without the index (--baseline-index off, the
default: `--cache-lookups false`, the index then serves membership only). Also the router decision
time for a 4096-token prompt against an embedded
Valkey (benchmarks/router_bench.py). With --endpoint only the client-side numbers are reported.
Prints a table and writes JSON (default benchmarks/results/routing.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from openai import OpenAI  # noqa: E402

from benchmarks.router_bench import run as router_decision_times  # noqa: E402
from services.router.scoring import POLICIES as KNOWN_POLICIES  # noqa: E402
from services.stack.launcher import free_port  # noqa: E402
from tests.factories import chat_case, encode_image, make_image  # noqa: E402
from tests.redis_servers import running_server, valkey_binary  # noqa: E402

POLICIES = ("cache_aware", "round_robin")
QUESTIONS = [
    "What is this?",
    "Describe the colours.",
    "Count the shapes.",
    "What style is it?",
    "Is it a photograph?",
    "What is in the centre?",
    "Name one object.",
    "What mood does it have?",
]
COUNTERS = {  # result key -> gateway /metrics counter
    "encoder_runs": "tessera_encoder_items_encoded_total",
    "prefill_tokens_computed": "tessera_prefill_tokens_computed_total",
    "prefix_cached_tokens": "tessera_prefix_cached_tokens_total",
    "kv_blocks_pulled": "tessera_prefill_kv_blocks_pulled_total",
}


@dataclass
class Sample:
    ttft_s: float | None = None
    latency_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None


# -- workload ---------------------------------------------------------------------------------
def _question(q: int) -> str:
    text = QUESTIONS[q % len(QUESTIONS)]
    return text if q < len(QUESTIONS) else f"{text} ({q // len(QUESTIONS) + 1})"


def workload(num_images: int, num_questions: int, size: tuple[int, int], seed: int) -> list[list[dict]]:
    """Message lists: round r asks question r of every image, images shuffled per round."""
    images = [encode_image(make_image(*size, seed=100 + i)) for i in range(num_images)]
    rng = random.Random(seed)
    order = []
    for q in range(num_questions):
        permutation = list(range(num_images))
        rng.shuffle(permutation)
        order += [(i, q) for i in permutation]
    return [chat_case(images[i], _question(q)).body["messages"] for i, q in order]


def warmup_messages(count: int, size: tuple[int, int]) -> list[list[dict]]:
    """Images not in the workload, so the measured run starts with cold caches for its images."""
    return [chat_case(encode_image(make_image(*size, seed=9000 + i)), "Describe this image.").body["messages"] for i in range(count)]


# -- client -----------------------------------------------------------------------------------
def _one_request(client: OpenAI, model: str, messages: list[dict], max_tokens: int) -> Sample:
    sample = Sample()
    started = time.perf_counter()
    try:
        stream = client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        for chunk in stream:  # bounded: max_tokens content chunks plus the usage chunk
            if sample.ttft_s is None and chunk.choices and chunk.choices[0].delta.content:
                sample.ttft_s = time.perf_counter() - started
            if chunk.usage is not None:
                sample.prompt_tokens = chunk.usage.prompt_tokens
                sample.completion_tokens = chunk.usage.completion_tokens
    except Exception as error:
        sample.error = f"{type(error).__name__}: {error}"
        return sample
    sample.latency_s = time.perf_counter() - started
    return sample


def run_workload(
    client: OpenAI, model: str, requests: list[list[dict]], concurrency: int, max_tokens: int, deadline_s: float
) -> tuple[list[Sample], float]:
    """Send ``requests`` in order from ``concurrency`` threads; (samples, wall seconds)."""
    executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="client")
    started = time.perf_counter()
    futures = [executor.submit(_one_request, client, model, m, max_tokens) for m in requests]
    done, not_done = wait(futures, timeout=deadline_s)
    wall = time.perf_counter() - started
    executor.shutdown(wait=not not_done, cancel_futures=True)
    samples = [f.result() if f in done else Sample(error="run deadline passed") for f in futures]
    return samples, wall


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def client_summary(samples: list[Sample], wall_s: float) -> dict:
    ok = [s for s in samples if s.error is None]
    ttfts = [s.ttft_s for s in ok if s.ttft_s is not None]
    errors = [s.error for s in samples if s.error is not None]
    return {
        "requests": len(samples),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "ttft_p50_ms": _ms(_percentile(ttfts, 0.50)),
        "ttft_p99_ms": _ms(_percentile(ttfts, 0.99)),
        "latency_p50_ms": _ms(_percentile([s.latency_s for s in ok], 0.50)),
        "wall_s": wall_s,
        "requests_per_s": len(ok) / wall_s,
        "prompt_tokens": sum(s.prompt_tokens for s in ok),
        "output_tokens": sum(s.completion_tokens for s in ok),
        "output_tokens_per_s": sum(s.completion_tokens for s in ok) / wall_s,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


# -- server counters --------------------------------------------------------------------------
def scrape_metrics(base_url: str) -> dict[str, float]:
    """The gateway's Prometheus text as {series: value}; {} when there is none."""
    try:
        response = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=30)
    except httpx.HTTPError:
        return {}
    if response.status_code != 200:
        return {}
    out = {}
    for line in response.text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


def server_summary(before: dict[str, float], after: dict[str, float], num_images: int, prompt_tokens: int) -> dict:
    deltas = {key: after[name] - before.get(name, 0.0) for key, name in COUNTERS.items() if name in after}
    result = dict(deltas)
    if "encoder_runs" in deltas:
        result["encoder_runs_per_image"] = deltas["encoder_runs"] / num_images
    if "prefill_tokens_computed" in deltas and prompt_tokens:
        result["prefill_computed_per_prompt_token"] = deltas["prefill_tokens_computed"] / prompt_tokens
    return result


# -- stack ------------------------------------------------------------------------------------
def start_stack(model: str, policy: str, use_index: bool, log_path: Path, timeout_s: float) -> tuple[subprocess.Popen, str]:
    """``tessera serve`` 2/2/2 with ``policy``; (launcher process, /v1 URL) once /health is 200."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "services.cli.main",
        "serve",
        "--model",
        model,
        "--port",
        str(port),
        "--generate-port",
        str(free_port()),
        "--encoders",
        "2",
        "--prefill",
        "2",
        "--decode",
        "2",
        "--routing-policy",
        policy,
        *([] if use_index else ["--cache-lookups", "false"]),
    ]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
    try:
        _wait_healthy(process, f"http://127.0.0.1:{port}", timeout_s)
    except BaseException:
        stop_stack(process)
        raise
    return process, f"http://127.0.0.1:{port}/v1"


def _wait_healthy(process: subprocess.Popen, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"tessera serve exited early (rc {process.returncode})")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the stack did not become healthy in {timeout_s:.0f}s")


def stop_stack(process: subprocess.Popen, timeout_s: float = 60) -> None:
    """Ctrl-C the launcher (it stops its roles, then its Valkey); kill it if it hangs."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout_s)


# -- one measured configuration ---------------------------------------------------------------
def measure(base_url: str, model: str, requests: list[list[dict]], args, *, with_counters: bool) -> dict:
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=args.request_timeout_s)
    try:
        for messages in warmup_messages(args.warmup, args.size):
            warm = _one_request(client, model, messages, 2)
            if warm.error is not None:
                raise RuntimeError(f"warm-up request failed: {warm.error}")
        before = scrape_metrics(base_url) if with_counters else {}
        samples, wall = run_workload(client, model, requests, args.concurrency, args.max_tokens, args.run_timeout_s)
        after = scrape_metrics(base_url) if with_counters else {}
    finally:
        client.close()
    result = client_summary(samples, wall)
    if with_counters:
        result.update(server_summary(before, after, args.images, result["prompt_tokens"]))
    return result


def run_policy(policy: str, requests: list[list[dict]], args, log_dir: Path) -> dict:
    use_index = policy != "round_robin" or args.baseline_index == "on"
    log_path = log_dir / f"{policy}.log"
    print(f"[{policy}] starting 2/2/2 stack (model {args.model}, index {'on' if use_index else 'off'}); log {log_path}", flush=True)
    process, base_url = start_stack(args.model, policy, use_index, log_path, args.start_timeout_s)
    try:
        result = measure(base_url, args.model, requests, args, with_counters=True)
    finally:
        stop_stack(process)
    return {"policy": policy, "index": use_index, **result}


def router_decision(decisions: int, prompt_tokens: int = 4096) -> dict:
    with running_server(valkey_binary()) as url:
        result = router_decision_times(url, prompt_tokens, decisions, 16)
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


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="small", help="tiny, small, or a checkpoint directory")
    parser.add_argument("--endpoint", default=None, help="benchmark this OpenAI-compatible endpoint instead of starting tessera")
    parser.add_argument("--served-model", default=None, help="model name to send with --endpoint (default: --model)")
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated routing policies, each on a fresh stack")
    parser.add_argument(
        "--baseline-index",
        choices=("on", "off"),
        default="off",
        help="run round_robin with the Valkey index (default off: --cache-lookups false)",
    )
    parser.add_argument("--images", type=int, default=12, help="distinct images")
    parser.add_argument("--questions", type=int, default=4, help="questions per image")
    parser.add_argument("--concurrency", type=int, default=4, help="concurrent client threads")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--image-size", default="448x448")
    parser.add_argument("--seed", type=int, default=7, help="seed of the interleaved order")
    parser.add_argument("--warmup", type=int, default=4, help="unmeasured requests (other images) before each run")
    parser.add_argument("--router-decisions", type=int, default=2000, help="router decisions to time (0: skip)")
    parser.add_argument("--request-timeout-s", type=float, default=300)
    parser.add_argument("--run-timeout-s", type=float, default=1800, help="deadline for one policy's whole workload")
    parser.add_argument("--start-timeout-s", type=float, default=600)
    parser.add_argument("--log-dir", type=Path, default=None, help="stack logs (default: a new temporary directory)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "routing.json")
    args = parser.parse_args()
    args.size = tuple(int(v) for v in args.image_size.split("x"))
    args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in args.policies if p not in KNOWN_POLICIES]
    if unknown or not args.policies:
        parser.error(f"--policies: choose from {', '.join(KNOWN_POLICIES)}")
    return args


def write_json(args, served: str, rows: list[dict], summary: dict, load_at_start: float) -> None:
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
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "routing",
                "command": " ".join(["python", "benchmarks/routing_bench.py", *sys.argv[1:]]),
                "machine": {
                    "cpus": os.cpu_count(),
                    "platform": platform.platform(),
                    "load_avg_1m_start": load_at_start,
                    "load_avg_1m_end": os.getloadavg()[0],
                },
                "model": served,
                "endpoint": args.endpoint,
                "baseline_index": args.baseline_index,
                "workload": workload_info,
                "results": rows,
                **summary,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


def warn_failures(rows: list[dict]) -> bool:
    failed = [row for row in rows if row["errors"]]
    for row in failed:
        print(
            f"WARNING {row['policy']}: {row['errors']} of {row['requests']} requests failed (first: {row['first_error']}); "
            "their TTFT/latency are left out and the wall time includes them",
            file=sys.stderr,
        )
    return bool(failed)


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: stacks are stopped
    # Started in the background by a script, SIGINT comes ignored and the launcher would inherit
    # that (and ignore our Ctrl-C while it starts); a handler here is reset to the default on exec.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    load_at_start = os.getloadavg()[0]
    requests = workload(args.images, args.questions, args.size, args.seed)
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
    write_json(args, served, rows, summary, load_at_start)
    if warn_failures(rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
