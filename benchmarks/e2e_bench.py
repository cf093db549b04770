"""End-to-end latency: the disaggregated stack (over HTTP, official openai client) against the
single-process engine, on the same requests, cold (new image) and cached (repeat).

    python benchmarks/e2e_bench.py --model small            # starts `tessera serve` itself
    python benchmarks/e2e_bench.py --endpoint http://host:8000/v1 --served-model NAME
                                                             # any OpenAI-compatible server (vLLM)
Prints a table and writes JSON (default benchmarks/results/e2e.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from openai import OpenAI  # noqa: E402

from benchmarks.serve_stack import start_stack, stop_stack  # noqa: E402
from tests.factories import chat_case, encode_image, make_image  # noqa: E402


def _cases(seed: int, n: int, size: tuple[int, int]):
    return [chat_case(encode_image(make_image(*size, seed=seed + i)), "Describe this image.") for i in range(n)]


def _time_http(client: OpenAI, model: str, messages, max_tokens: int) -> float:
    started = time.perf_counter()
    client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True})
    return time.perf_counter() - started


def _time_engine(llm, body, max_tokens: int) -> float:
    from services.engine.sampling import SamplingParams

    started = time.perf_counter()
    llm.generate([body], SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return time.perf_counter() - started


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="small")
    parser.add_argument("--endpoint", default=None, help="benchmark this OpenAI-compatible endpoint instead of starting tessera")
    parser.add_argument("--served-model", default=None)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--image-size", default="448x448")
    parser.add_argument("--skip-engine", action="store_true", help="do not measure the single-process engine")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "e2e.json")
    args = parser.parse_args()
    args.size = tuple(int(v) for v in args.image_size.split("x"))
    return args


def measure_http(args) -> dict:
    """Cold then cached medians over HTTP, against ``--endpoint`` or a `tessera serve` started here."""
    stack = None
    if args.endpoint is None:
        stack, endpoint = start_stack(args.model, [])
        served = args.model
    else:
        endpoint, served = args.endpoint, args.served_model or args.model
    client = OpenAI(base_url=endpoint, api_key="unused", max_retries=0, timeout=600)
    try:
        warm = _cases(7000, 1, args.size)[0]
        _time_http(client, served, warm.body["messages"], 2)
        cases = _cases(100, args.requests, args.size)
        http_cold = [_time_http(client, served, c.body["messages"], args.max_tokens) for c in cases]
        http_cached = [_time_http(client, served, c.body["messages"], args.max_tokens) for c in cases]
    finally:
        if stack is not None:
            stop_stack(stack)
    return {
        "endpoint": endpoint,
        "http_cold_median_s": statistics.median(http_cold),
        "http_cached_median_s": statistics.median(http_cached),
    }


def measure_engine(args, rows: dict) -> None:
    """The same requests on the single-process engine; medians and stack/engine ratios into ``rows``."""
    from services.engine.llm import LLM

    llm = LLM(args.model)
    _time_engine(llm, _cases(7000, 1, args.size)[0].body, 2)
    engine_cold = [_time_engine(llm, c.body, args.max_tokens) for c in _cases(100, args.requests, args.size)]
    engine_cached = [_time_engine(llm, c.body, args.max_tokens) for c in _cases(100, args.requests, args.size)]
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


def write_json(args, rows: dict) -> None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "e2e",
                "command": " ".join(["python", "benchmarks/e2e_bench.py", *sys.argv[1:]]),
                "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                "results": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


def main() -> None:
    args = parse_args()
    rows = measure_http(args)
    if not args.skip_engine:
        measure_engine(args, rows)
    print_table(args, rows)
    write_json(args, rows)


if __name__ == "__main__":
    main()
