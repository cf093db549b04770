"""The pre-admission media budget under large images sent back to back, with and without it, in
one run on a real `tessera serve` stack (two stacks, one after the other, the same traffic).

    tessera bench --suite media_budget                       # tiny model, budget of 2 large images
    tessera bench --suite media_budget --large-clients 8 --large-size 1344 --small 16 --budget 9216

Traffic, for ``--spread-s`` seconds: ``--large-clients`` clients each send a new
``--large-size``-pixel square image as soon as their previous request was answered (or, after a
429, after a pause of REFUSED_PAUSE_S); and ``--small`` requests with a new 112x112 image each
arrive evenly spread. Every request is counted, per size: answered, refused (429), too large
(413), other. Time to first token is over all requests, a refused one counting as never answered
(so a p50 is "refused" when half were), and goodput is the share of all requests answered within
``--slo-s``: a refusal is a failure, never absent.
Prints a table and writes JSON (default benchmarks/results/media_budget.json).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import tempfile
import time
from pathlib import Path

from openai import APIStatusError, AsyncOpenAI

from benchmarks.suites.common import RESULTS, command, machine, percentile_ms, write_json
from services.bench.local_stack import start_stack, stop_stack
from services.bench.workloads import image_url, synthetic_image, user_turn

MAX_REQUESTS_PER_CLIENT = 1000  # a bound on each large client's loop (it stops at --spread-s)
REFUSED_PAUSE_S = 0.2  # a large client's pause after a 429, so refusals do not spin


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--large-clients", type=int, default=4, help="clients sending large-image requests back to back")
    parser.add_argument("--large-size", type=int, default=1344, help="their side in pixels (Qwen2-VL: 1344 -> 2304 vision tokens)")
    parser.add_argument("--small", type=int, default=12, help="small-image requests spread over --spread-s")
    parser.add_argument("--spread-s", type=float, default=6.0)
    parser.add_argument("--budget", type=int, default=4608, help="max_media_tokens_per_encoder of the budgeted stack")
    parser.add_argument("--slo-s", type=float, default=5.0, help="time to first token within which an answer counts as goodput")
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


async def _large_client(client: AsyncOpenAI, args, seed: int, until: float) -> list[tuple[int, float]]:
    outcomes = []
    for i in range(MAX_REQUESTS_PER_CLIENT):
        if time.monotonic() >= until:
            break
        outcomes.append(await _ask(client, args.model, image_url(synthetic_image(args.large_size, args.large_size, seed=seed + i))))
        if outcomes[-1][0] == 429:
            await asyncio.sleep(REFUSED_PAUSE_S)
    return outcomes


async def _traffic(url: str, args, seed: int) -> dict:
    client = AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
    await _ask(client, args.model, image_url(synthetic_image(112, 112, seed=seed)))  # warm-up
    until = time.monotonic() + args.spread_s
    large_tasks = [asyncio.create_task(_large_client(client, args, seed + 10_000 * (1 + c), until)) for c in range(args.large_clients)]
    small_tasks = []
    for i in range(args.small):
        await asyncio.sleep(args.spread_s / max(1, args.small))
        small_tasks.append(asyncio.create_task(_ask(client, args.model, image_url(synthetic_image(112, 112, seed=seed + 1000 + i)))))
    large = [outcome for outcomes in await asyncio.gather(*large_tasks) for outcome in outcomes]
    return {"large": large, "small": await asyncio.gather(*small_tasks)}


def _summary(outcomes: list[tuple[int, float]], slo_s: float) -> dict:
    """Every request counted; TTFTs over all of them, a refusal as never answered (inf)."""
    ttfts = sorted(t if status == 200 else math.inf for status, t in outcomes)
    num = len(outcomes)
    return {
        "num_sent": num,
        "num_answered": sum(status == 200 for status, _ in outcomes),
        "num_429": sum(status == 429 for status, _ in outcomes),
        "num_413": sum(status == 413 for status, _ in outcomes),
        "num_other": sum(status not in (200, 413, 429) for status, _ in outcomes),
        "ttft_p50_ms": percentile_ms(ttfts, 0.5),  # None: that request was refused
        "ttft_p90_ms": percentile_ms(ttfts, 0.9),
        "goodput": sum(t <= slo_s for t in ttfts) / num if num else None,
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
        sizes = {size: _summary(outcomes[size], args.slo_s) for size in ("large", "small")}
        result["stacks"][name] = {"budget": budget, "slo_s": args.slo_s, **sizes}
    _print(result)
    write_json(args.out, result)
    return 0


def _print(result: dict) -> None:
    """Every request is counted per size (sent: answered / 429 / 413 / other); TTFT percentiles
    are over all of them, a refusal counting as never answered; goodput is answered within the SLO
    over all sent."""
    head = ("stack", "budget", "size", "sent", "ok/429/413/other", "TTFT p50 ms", "TTFT p90 ms", "goodput")
    print(f"{head[0]:<8} {head[1]:>7} {head[2]:<6} {head[3]:>5} {head[4]:>17} {head[5]:>12} {head[6]:>12} {head[7]:>8}")
    for name, stack in result["stacks"].items():
        for size in ("small", "large"):
            row = stack[size]
            counts = f"{row['num_answered']}/{row['num_429']}/{row['num_413']}/{row['num_other']}"
            goodput = "-" if row["goodput"] is None else f"{row['goodput']:.2f}"
            print(
                f"{name:<8} {stack['budget']:>7} {size:<6} {row['num_sent']:>5} {counts:>17} {_fmt(row['ttft_p50_ms']):>12} "
                f"{_fmt(row['ttft_p90_ms']):>12} {goodput:>8}"
            )
    print(f"(TTFT over all requests, 'refused' where that percentile was refused; goodput: answered within {_slo(result)} s, of all sent)")


def _slo(result: dict) -> str:
    return f"{next(iter(result['stacks'].values()))['slo_s']:g}"


def _fmt(value: float | None) -> str:
    return "refused" if value is None else f"{value:.0f}"
