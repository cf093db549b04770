"""The pre-admission media budget under a burst of large images, with and without it, in one run
on a real `tessera serve` stack (two stacks, one after the other, the same traffic).

    tessera bench --suite media_budget                       # tiny model, budget of 4 large images
    tessera bench --suite media_budget --large 24 --large-size 1344 --small 16 --budget 9216

Traffic: ``--large`` requests, each a new ``--large-size``-pixel square image, sent at once; and
``--small`` requests with a new 112x112 image each, spread over the next ``--spread-s`` seconds.
Measured per stack: the small requests' time to first token (median and max), and the large
requests' outcomes (answered, 429) and time to first token. Without the budget every large image
queues on the encoder ahead of the small ones; with it, the large ones past the budget are
refused at once and the small ones pass.
Prints a table and writes JSON (default benchmarks/results/media_budget.json).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from openai import APIStatusError, AsyncOpenAI

from benchmarks.suites.common import RESULTS, command, machine, ms, write_json
from services.bench.local_stack import start_stack, stop_stack
from services.bench.workloads import image_url, synthetic_image, user_turn


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--large", type=int, default=16, help="large-image requests sent at once")
    parser.add_argument("--large-size", type=int, default=1344, help="their side in pixels (Qwen2-VL: 1344 -> 2304 vision tokens)")
    parser.add_argument("--small", type=int, default=12, help="small-image requests spread over --spread-s")
    parser.add_argument("--spread-s", type=float, default=6.0)
    parser.add_argument("--budget", type=int, default=9216, help="max_media_tokens_per_encoder of the budgeted stack")
    parser.add_argument("--out", type=Path, default=RESULTS / "media_budget.json")


async def _ask(client: AsyncOpenAI, model: str, url: str) -> tuple[int, float]:
    """(status, seconds to the first token, or to the refusal)."""
    sent = time.monotonic()
    try:
        chunks = await client.chat.completions.create(
            model=model, messages=user_turn(url, "Describe it."), stream=True, max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
        )
        first = None
        async for _ in chunks:
            first = first or time.monotonic()
        return 200, (first or time.monotonic()) - sent
    except APIStatusError as exc:
        return exc.status_code, time.monotonic() - sent


async def _traffic(url: str, args, seed: int) -> dict:
    client = AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
    await _ask(client, args.model, image_url(synthetic_image(112, 112, seed=seed)))  # warm-up
    large = [image_url(synthetic_image(args.large_size, args.large_size, seed=seed + 1 + i)) for i in range(args.large)]
    small = [image_url(synthetic_image(112, 112, seed=seed + 1000 + i)) for i in range(args.small)]
    large_tasks = [asyncio.create_task(_ask(client, args.model, u)) for u in large]
    small_tasks = []
    for u in small:
        await asyncio.sleep(args.spread_s / max(1, args.small))
        small_tasks.append(asyncio.create_task(_ask(client, args.model, u)))
    return {"large": await asyncio.gather(*large_tasks), "small": await asyncio.gather(*small_tasks)}


def _summary(outcomes: list[tuple[int, float]]) -> dict:
    answered = [t for status, t in outcomes if status == 200]
    return {
        "num_answered": len(answered),
        "num_429": sum(status == 429 for status, _ in outcomes),
        "num_other": sum(status not in (200, 429) for status, _ in outcomes),
        "ttft_median_ms": ms(statistics.median(answered)) if answered else None,
        "ttft_max_ms": ms(max(answered)) if answered else None,
    }


def run(args) -> int:
    result = {"command": command(args), "machine": machine(), "stacks": {}}
    for name, budget in (("without", 0), ("with", args.budget)):
        with tempfile.TemporaryDirectory(prefix="media-budget-") as workdir:
            extra = ["--max-media-tokens-per-encoder", str(budget), "--no-restart"]
            process, url = start_stack(args.model, extra, Path(workdir) / "stack.log")
            try:
                outcomes = asyncio.run(_traffic(url, args, seed=100))
            finally:
                stop_stack(process)
        result["stacks"][name] = {"budget": budget, "large": _summary(outcomes["large"]), "small": _summary(outcomes["small"])}
    _print(result)
    write_json(args.out, result)
    return 0


def _print(result: dict) -> None:
    """Every request is counted (answered, 429, other); a TTFT is over the answered ones only,
    which the count beside it says: it is no result without them."""
    head = ("stack", "budget", "small ok/429/other", "small p50 ms", "small max ms", "large ok/429/other", "large p50 ms")
    print(f"{head[0]:<8} {head[1]:>7} {head[2]:>19} {head[3]:>13} {head[4]:>13} {head[5]:>19} {head[6]:>13}")
    for name, stack in result["stacks"].items():
        small, large = stack["small"], stack["large"]
        print(
            f"{name:<8} {stack['budget']:>7} {_counts(small):>19} {_fmt(small['ttft_median_ms']):>13} {_fmt(small['ttft_max_ms']):>13} "
            f"{_counts(large):>19} {_fmt(large['ttft_median_ms']):>13}"
        )
    print("(TTFTs are of the answered requests only)")


def _counts(summary: dict) -> str:
    return f"{summary['num_answered']}/{summary['num_429']}/{summary['num_other']}"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"
