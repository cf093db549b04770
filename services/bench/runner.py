"""Send a workload to one or more OpenAI-compatible endpoints and time every request.

Requests go out in workload order, at most ``concurrency`` at a time, round-robin over the
endpoints: all due at once (a closed loop), or at the arrival times of an open loop
(``request_rate``, services/bench/arrivals.py), still capped by ``concurrency``. Each is a
streamed chat completion of exactly ``max_tokens`` tokens (``ignore_eos``, which vLLM accepts
too), so every system generates the same amount. A request's TTFT is its first non-empty content
chunk; every content chunk's time is kept (inter-token latencies). Times are seconds from the
run's start, so a run can be plotted over time. A progress bar shows completions (off when stderr
is not a terminal, or on request). With a deadline, requests not done by then are cancelled and
recorded as failed.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field

import httpx
import openai
from tqdm import tqdm

from services.bench.arrivals import arrival_offsets
from services.bench.workloads import BenchRequest


@dataclass(frozen=True, slots=True)
class Endpoint:
    base_url: str  # .../v1
    model: str


@dataclass(slots=True)
class RequestRecord:
    index: int
    endpoint: str
    first_touch: bool
    start_s: float
    ttft_s: float | None = None  # from this request's start
    end_s: float | None = None  # from the run's start
    num_tokens: int = 0
    prompt_tokens: int = 0  # as the endpoint's usage counts them
    error: str | None = None
    queue_s: float = 0.0  # due but not yet sent (open loop): waiting for a concurrency slot, or a late client loop
    token_times_s: list[float] = field(default_factory=list)  # each content chunk, from this request's start


@dataclass(frozen=True, slots=True)
class RunSettings:
    concurrency: int = 4
    max_tokens: int = 16
    timeout_s: float = 600.0
    progress: bool = True
    deadline_s: float | None = None  # for the whole run; None: wait for every request
    request_rate: float | None = None  # requests per second, open loop; None: closed loop
    burstiness: float = 1.0  # gamma shape of the open loop's gaps (1: Poisson)
    seed: int = 0  # fixes the open loop's arrival times


async def run_workload(requests: list[BenchRequest], endpoints: list[Endpoint], settings: RunSettings) -> tuple[list[RequestRecord], float]:
    """(one record per request, in workload order; wall seconds)."""
    limits = httpx.Limits(max_connections=settings.concurrency + 4)
    gate = asyncio.Semaphore(settings.concurrency)
    progress = tqdm(total=len(requests), unit="req", disable=not (settings.progress and sys.stderr.isatty()), file=sys.stderr)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(settings.timeout_s)) as http:
        clients = [openai.AsyncOpenAI(base_url=e.base_url, api_key="bench", http_client=http, max_retries=0) for e in endpoints]
        due = arrival_offsets(len(requests), settings.request_rate, burstiness=settings.burstiness, seed=settings.seed)
        started = time.perf_counter()

        async def one(i: int, request: BenchRequest) -> RequestRecord:
            await asyncio.sleep(max(0.0, due[i] - (time.perf_counter() - started)))
            async with gate:
                endpoint, client = endpoints[i % len(endpoints)], clients[i % len(clients)]
                record = RequestRecord(i, endpoint.base_url, request.first_touch, time.perf_counter() - started)
                record.queue_s = max(0.0, record.start_s - due[i])
                await _stream(client, endpoint.model, request, settings.max_tokens, record, started)
                progress.update(1)
                return record

        tasks = [asyncio.ensure_future(one(i, r)) for i, r in enumerate(requests)]
        done, late = await asyncio.wait(tasks, timeout=settings.deadline_s) if tasks else (set(), set())
        wall_s = time.perf_counter() - started
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
    progress.close()
    records = [
        task.result() if task in done else _late(i, request, endpoints, wall_s) for i, (task, request) in enumerate(zip(tasks, requests))
    ]
    return records, wall_s


def _late(index: int, request: BenchRequest, endpoints: list[Endpoint], wall_s: float) -> RequestRecord:
    """A request the run's deadline cut off (waiting for its turn, or streaming)."""
    return RequestRecord(index, endpoints[index % len(endpoints)].base_url, request.first_touch, wall_s, error="run deadline passed")


async def _stream(client: openai.AsyncOpenAI, model: str, request: BenchRequest, max_tokens: int, record: RequestRecord, t0: float) -> None:
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=request.messages,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        async for chunk in stream:  # bounded: max_tokens content chunks plus the usage chunk
            if chunk.choices and chunk.choices[0].delta.content:
                record.token_times_s.append(time.perf_counter() - t0 - record.start_s)
                if record.ttft_s is None:
                    record.ttft_s = record.token_times_s[0]
            if chunk.usage is not None:
                record.num_tokens = chunk.usage.completion_tokens
                record.prompt_tokens = chunk.usage.prompt_tokens
        record.end_s = time.perf_counter() - t0
    except (openai.APIError, httpx.HTTPError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"


async def served_model(base_url: str) -> str:
    """The first model an endpoint lists (what its /v1/models says it serves)."""
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.get(base_url.rstrip("/") + "/models")
        response.raise_for_status()
        return response.json()["data"][0]["id"]
