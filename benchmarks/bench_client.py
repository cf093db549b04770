"""Concurrent streaming chat client (official openai client, temperature 0, ignore_eos) and its
client-side summary: TTFT (first streamed content chunk) p50/p99, latency p50, throughput."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

from openai import OpenAI

from services.bench.report import percentile


@dataclass
class Sample:
    ttft_s: float | None = None
    latency_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None


def one_request(client: OpenAI, model: str, messages: list[dict], max_tokens: int) -> Sample:
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
    futures = [executor.submit(one_request, client, model, m, max_tokens) for m in requests]
    done, not_done = wait(futures, timeout=deadline_s)
    wall = time.perf_counter() - started
    executor.shutdown(wait=not not_done, cancel_futures=True)
    samples = [f.result() if f in done else Sample(error="run deadline passed") for f in futures]
    return samples, wall


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def client_summary(samples: list[Sample], wall_s: float) -> dict:
    ok = [s for s in samples if s.error is None]
    ttfts = [s.ttft_s for s in ok if s.ttft_s is not None]
    errors = [s.error for s in samples if s.error is not None]
    return {
        "requests": len(samples),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "ttft_p50_ms": ms(percentile(ttfts, 0.50)),
        "ttft_p99_ms": ms(percentile(ttfts, 0.99)),
        "latency_p50_ms": ms(percentile([s.latency_s for s in ok], 0.50)),
        "wall_s": wall_s,
        "requests_per_s": len(ok) / wall_s,
        "prompt_tokens": sum(s.prompt_tokens for s in ok),
        "output_tokens": sum(s.completion_tokens for s in ok),
        "output_tokens_per_s": sum(s.completion_tokens for s in ok) / wall_s,
    }
