"""Calls handed to a loop from another thread run there, in order, with one wake-up per burst."""

from __future__ import annotations

import asyncio
import threading

from shared.loop_handoff import LoopHandoff


def test_a_burst_from_another_thread_runs_in_order_on_the_loop_with_one_wake_up():
    async def scenario() -> tuple[list[int], set[int], int]:
        loop = asyncio.get_running_loop()
        handoff = LoopHandoff(loop)
        num_wakes = 0
        original = loop.call_soon_threadsafe

        def counting_call_soon_threadsafe(*args, **kwargs):
            nonlocal num_wakes
            num_wakes += 1
            return original(*args, **kwargs)

        loop.call_soon_threadsafe = counting_call_soon_threadsafe  # type: ignore[method-assign]
        seen: list[int] = []
        threads: set[int] = set()
        done = asyncio.Event()

        def record(value: int) -> None:
            seen.append(value)
            threads.add(threading.get_ident())
            if value == 99:
                done.set()

        worker = threading.Thread(target=lambda: [handoff.call(record, i) for i in range(100)])
        worker.start()  # the loop is not running its callbacks meanwhile: one burst
        worker.join()
        await asyncio.wait_for(done.wait(), timeout=5)
        return seen, threads, num_wakes

    seen, threads, num_wakes = asyncio.run(scenario())
    assert seen == list(range(100))
    assert threads == {threading.get_ident()}  # asyncio.run's loop runs on this thread
    assert num_wakes == 1


def test_a_failing_call_does_not_drop_the_others():
    async def scenario() -> list[int]:
        handoff = LoopHandoff(asyncio.get_running_loop())
        seen: list[int] = []

        def record(value: int) -> None:
            if value == 1:
                raise ValueError("one bad callback")
            seen.append(value)

        for i in range(3):
            handoff.call(record, i)
        await asyncio.sleep(0.01)
        return seen

    assert asyncio.run(scenario()) == [0, 2]
