"""A decode node's step pacing: the rule, and the engine loop keeping to it while still taking
calls at once (the loop runs on a stand-in engine that records when it steps)."""

from __future__ import annotations

import threading
import time

from services.engine.engine_loop import EngineLoop
from shared.colocation.host_backlog import BacklogBoard, create_board
from shared.colocation.step_pacing import PacingRule, step_interval_s, step_pacing

RULE = PacingRule(step_ms=100, max_step_ms=250, backlog=4, max_streams=16, ready=2)


def test_the_floor_applies_from_the_backlog_on_and_to_small_batches_only():
    assert step_interval_s(3, 1, RULE) == 0.0
    assert step_interval_s(4, 1, RULE) == 0.1
    assert step_interval_s(40, 17, RULE) == 0.0  # a wide batch is mostly per-row work


def test_the_floor_grows_with_the_queue_up_to_its_bound():
    assert step_interval_s(6, 1, RULE) == 0.15
    assert step_interval_s(8, 16, RULE) == 0.2
    assert step_interval_s(10, 1, RULE) == 0.25 and step_interval_s(40, 16, RULE) == 0.25


def test_no_board_or_a_zero_step_means_no_pacing(tmp_path):
    board = BacklogBoard(create_board(tmp_path / "board", 1))
    assert step_pacing(None, RULE) is None
    assert step_pacing(board, PacingRule(step_ms=0)) is None
    pacing = step_pacing(board, RULE)
    assert pacing is not None and pacing.min_interval_s(1) == 0.0
    board.post(0, 4)
    assert pacing.min_interval_s(1) == 0.1 and pacing.min_interval_s(17) == 0.0
    assert pacing.num_yielding_steps == 1


class SteppingEngine:
    """Has work for ``num_steps`` steps; records when each starts."""

    def __init__(self, num_steps: int) -> None:
        self.num_steps_left = num_steps
        self.num_steps = 0  # steps that scheduled work, as Engine counts them
        self.step_times: list[float] = []
        self.requests: dict = {}
        self.done = threading.Event()

    def has_unfinished(self) -> bool:
        return self.num_steps_left > 0

    def step(self) -> list:
        self.step_times.append(time.monotonic())
        self.num_steps += 1
        self.num_steps_left -= 1
        if self.num_steps_left == 0:
            self.done.set()
        return []

    def take_failures(self) -> list:
        return []


def run_loop(num_steps: int, interval_s: float | None) -> tuple[EngineLoop, SteppingEngine]:
    engine = SteppingEngine(num_steps)
    loop = EngineLoop(lambda: engine, min_step_interval=(lambda _num_streams: interval_s) if interval_s is not None else None)
    return loop, engine


def test_paced_steps_start_at_least_the_interval_apart():
    loop, engine = run_loop(5, 0.05)
    assert engine.done.wait(10)
    loop.stop()
    gaps = [b - a for a, b in zip(engine.step_times, engine.step_times[1:], strict=False)]
    assert len(gaps) == 4 and min(gaps) >= 0.05


def test_unpaced_steps_run_back_to_back():
    loop, engine = run_loop(50, None)
    assert engine.done.wait(10)
    loop.stop()
    assert engine.step_times[-1] - engine.step_times[0] < 0.05 * 49


def test_a_call_arriving_while_a_step_waits_runs_at_once():
    loop, engine = run_loop(3, 1.0)
    time.sleep(0.1)  # the first step ran; the next waits about 0.9 s more
    sent = time.monotonic()
    ran_at = loop.call(lambda _engine: time.monotonic()).result(timeout=5)
    assert ran_at - sent < 0.5 and len(engine.step_times) == 1
    assert engine.done.wait(10)
    loop.stop()


def test_ready_prompts_pace_from_their_own_threshold():
    assert step_interval_s(0, 1, RULE, num_ready=1) == 0.0
    assert step_interval_s(0, 1, RULE, num_ready=2) == 0.1  # a burst's prompts, ready at once
    assert step_interval_s(0, 1, RULE, num_ready=3) == 0.15
    assert step_interval_s(8, 1, RULE, num_ready=2) == 0.2  # the larger of the two shares
    assert step_interval_s(3, 1, RULE, num_ready=1) == 0.0  # 3 calls, but mostly waiting on encodes
    assert step_interval_s(0, 17, RULE, num_ready=5) == 0.0  # a wide batch steps freely


def test_the_board_s_ready_prompts_reach_the_pacing(tmp_path):
    board = BacklogBoard(create_board(tmp_path / "board", 1))
    pacing = step_pacing(board, RULE)
    assert pacing is not None and pacing.min_interval_s(1) == 0.0
    board.post_ready(0, 2)
    assert pacing.min_interval_s(1) == 0.1
