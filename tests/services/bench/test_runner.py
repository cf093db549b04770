"""The runner's deadline: requests not done by then are cancelled and recorded as failed, in
workload order (the streaming itself is faked: no endpoint)."""

from __future__ import annotations

import asyncio

import pytest

from services.bench import runner
from services.bench.runner import Endpoint, RunSettings, run_workload
from services.bench.workloads import WorkloadSpec, build_workload


def test_a_deadline_cancels_what_is_left_and_records_it_failed(monkeypatch):
    async def fake_stream(client, model, request, max_tokens, record, t0):
        if record.index % 2:
            await asyncio.sleep(60)  # never finishes before the deadline
        record.num_tokens, record.prompt_tokens, record.end_s = max_tokens, 10, record.start_s

    monkeypatch.setattr(runner, "_stream", fake_stream)
    requests = build_workload("long_prompts", WorkloadSpec(num_requests=4))
    settings = RunSettings(concurrency=4, max_tokens=3, progress=False, deadline_s=0.5)
    records, wall_s = asyncio.run(run_workload(requests, [Endpoint("http://127.0.0.1:9/v1", "m")], settings))
    assert [r.index for r in records] == [0, 1, 2, 3] and wall_s < 5
    assert [r.error for r in records] == [None, "run deadline passed", None, "run deadline passed"]
    assert [r.prompt_tokens for r in records] == [10, 0, 10, 0]


def test_an_open_loop_sends_each_request_at_its_arrival_time_capped_by_concurrency(monkeypatch):
    async def fake_stream(client, model, request, max_tokens, record, t0):
        await asyncio.sleep(0.3)
        record.num_tokens, record.end_s = max_tokens, record.start_s + 0.3

    monkeypatch.setattr(runner, "_stream", fake_stream)
    requests = build_workload("long_prompts", WorkloadSpec(num_requests=6))
    settings = RunSettings(concurrency=2, max_tokens=3, progress=False, request_rate=20.0, burstiness=1.0, seed=5)
    records, _ = asyncio.run(run_workload(requests, [Endpoint("http://127.0.0.1:9/v1", "m")], settings))
    due = runner.arrival_offsets(6, 20.0, burstiness=1.0, seed=5)
    for r in records:
        assert r.start_s >= due[r.index] - 0.01, "sent before it was due"
        assert r.start_s == pytest.approx(due[r.index] + r.queue_s, abs=0.05)
    # Two slots, 0.3 s each, arrivals ~0.05 s apart: later requests wait for a slot.
    assert max(r.queue_s for r in records) > 0.1
