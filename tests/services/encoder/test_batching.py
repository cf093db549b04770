"""The Encode batcher's line: a row budget per batch (a call larger than it still runs, alone),
calls that went away or ran out of time leave the line, and each call gets its own outcome."""

from __future__ import annotations

import asyncio

import pytest

from services.encoder.batching import BatchMetrics, DeadlinePassedError, EncodeBatcher
from services.encoder.node import EncodeItem, EncodeResult
from shared.types import MmHash


def items(name: str, num_rows: int) -> list[EncodeItem]:
    return [EncodeItem(MmHash(name), num_rows, (1, 2, 2 * num_rows))]


def queue(batcher: EncodeBatcher, *calls: tuple[str, int], deadline: float | None = None) -> list[asyncio.Future]:
    """Line calls up without starting the worker (take_batch is driven by hand)."""
    from services.encoder.batching import QueuedCall

    loop = asyncio.get_running_loop()
    futures = []
    for name, num_rows in calls:
        future = loop.create_future()
        batcher._line.append(QueuedCall(items(name, num_rows), "tcp://x", future, 0.0, deadline))
        futures.append(future)
    return futures


def names(batch) -> list[str]:
    return [call.items[0].mm_hash for call in batch]


async def no_batch(calls):
    return []


def test_batches_fill_up_to_the_row_budget_in_arrival_order():
    async def scenario() -> None:
        batcher = EncodeBatcher(no_batch, max_batch_rows=100)
        queue(batcher, ("a", 60), ("b", 40), ("c", 10), ("huge", 500), ("d", 5))
        assert names(batcher.take_batch(now=1.0)) == ["a", "b"]
        assert names(batcher.take_batch(now=1.0)) == ["c"]  # "huge" does not fit beside it
        assert names(batcher.take_batch(now=1.0)) == ["huge"]  # alone, over the budget
        assert names(batcher.take_batch(now=1.0)) == ["d"]
        assert batcher.take_batch(now=1.0) == []

    asyncio.run(scenario())


def test_calls_that_went_away_or_ran_out_of_time_leave_the_line():
    async def scenario() -> None:
        batcher = EncodeBatcher(no_batch)
        [gone, kept] = queue(batcher, ("gone", 4), ("kept", 4))
        [late] = queue(batcher, ("late", 4), deadline=5.0)
        gone.cancel()
        assert names(batcher.take_batch(now=6.0)) == ["kept"]
        with pytest.raises(DeadlinePassedError):
            late.result()
        kept.cancel()

    asyncio.run(scenario())


def test_each_call_gets_its_own_result_or_failure_and_queue_time_is_recorded():
    seen: list[list[str]] = []

    async def run_batch(calls):
        seen.append([call_items[0].mm_hash for call_items, _ in calls])
        return [RuntimeError("bad pixels") if call_items[0].mm_hash == "bad" else EncodeResult([], 1, 0) for call_items, _ in calls]

    async def scenario() -> None:
        metrics = BatchMetrics()
        batcher = EncodeBatcher(run_batch, metrics=metrics)
        outcomes = await asyncio.gather(
            batcher.encode(items("ok", 4), "tcp://x"), batcher.encode(items("bad", 4), "tcp://x"), return_exceptions=True
        )
        assert isinstance(outcomes[0], EncodeResult) and isinstance(outcomes[1], RuntimeError)
        assert metrics.queue_time.value.count == 2.0 and metrics.num_calls_batched.value == 2.0

    asyncio.run(scenario())
    assert seen == [["ok", "bad"]]  # both lined up before the worker ran: one batch


def test_a_budget_below_one_row_is_refused():
    with pytest.raises(ValueError):
        EncodeBatcher(no_batch, max_batch_rows=0)


def test_the_default_budget_is_one_call_per_pass_on_cpu_and_rows_on_an_accelerator():
    from services.encoder.batching import CPU_MAX_BATCH_ROWS, DEFAULT_MAX_BATCH_ROWS, default_max_batch_rows

    assert default_max_batch_rows("cpu") == CPU_MAX_BATCH_ROWS == 1
    assert default_max_batch_rows("cuda") == DEFAULT_MAX_BATCH_ROWS
