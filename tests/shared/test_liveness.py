"""Liveness: a heartbeat is earned by progress, not by a thread merely running."""

from __future__ import annotations

import threading

from shared.liveness import Liveness
from tests.fake_clock import FakeClock


def test_a_work_item_running_past_the_stall_limit_makes_the_node_not_alive():
    clock = FakeClock()
    liveness = Liveness(stall_s=30, clock=clock)
    watch = liveness.watch("engine")
    with watch.busy():
        clock.now += 29
        assert liveness.is_alive()
        clock.now += 2
        assert liveness.problems() == ["engine: one work item has run for 31s"]
    assert liveness.is_alive()  # it finished: progress again


def test_an_idle_loop_that_promised_to_tick_and_did_not_is_not_alive():
    clock = FakeClock()
    liveness = Liveness(stall_s=30, clock=clock)
    watch = liveness.watch("event-loop", max_idle_s=5)
    clock.now += 4
    watch.tick()
    clock.now += 4
    assert liveness.is_alive()
    clock.now += 2
    assert not liveness.is_alive()


def test_a_loop_without_a_tick_promise_may_sleep_forever():
    clock = FakeClock()
    liveness = Liveness(stall_s=30, clock=clock)
    liveness.watch("encoder")
    clock.now += 10_000
    assert liveness.is_alive()


def test_a_dead_thread_is_not_alive():
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()
    liveness = Liveness()
    liveness.watch("engine", thread=thread)
    assert liveness.problems() == ["engine: its thread has died"]
