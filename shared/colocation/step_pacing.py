"""How often a decode node steps while first-token work queues on the cores it shares.

Rule: a decode node given the host's backlog board (shared/colocation/host_backlog.py says why) waits, from
one step's start to the next's, at least

    min(step_ms * max(num_waiting / backlog, num_ready / ready), max_step_ms)

while a colocated encoder or prefill node holds num_waiting >= ``backlog`` calls (the longest
queue), or a colocated prefill node holds num_ready >= ``ready`` prompts it could compute now,
and the node holds at most ``max_streams`` streams; otherwise it steps as soon as the last
step ends. Calls that arrive meanwhile (new streams, aborts) are still taken at once; only the
next step waits. The rule's numbers are the decode role's settings (``yield_*``,
services/decode/main.py); every other role runs without them.

Why a floor on the step interval rather than a pause: streams keep a bounded pace (250 ms per
token at most is 4 tokens a second, under vLLM's TPOT when its prefills queue), and each step
serves every stream that joined during the wait, so the weights read per token fall.
Why it grows with the queue: with a deep queue, every first token waits behind the whole queue's
encodes and prefills, and the cores decode gives up go to them; in a closed loop (a client that
sends a request when one ends) the queue's wait is most of the time to first token, while a
stream's tokens are a small share of it (docs/benchmarks.md, "Decode yields more to a deeper
queue").
Why only small batches: a step's fixed cost (reading every weight) is what yielding saves, and it
dominates only while the batch is small (the step costs by width are in docs/benchmarks.md, "Decode
step"); a wide batch is mostly per-row work, which waiting does not save.
Why a backlog of 4: a client holding up to 4 requests at once never has 4 waiting while one of its
streams decodes, so it sees decode at full pace; deeper queues are where the first tokens wait
seconds (docs/benchmarks.md, "Decode yields to a first-token backlog").
Why ready prompts count apart, from 2: calls waiting include prefills still waiting on their
encodes, which decode yielding does not speed up; a prompt whose embeddings are resident is
computed at once with the cores decode gives up. Two or more ready while a stream decodes is
mostly a burst, such as a closed loop's start, where vLLM prefills the whole batch before it
decodes; yielding then brought the burst's last first token sooner on `long_prompts`
(docs/benchmarks.md, "Decode yields to ready prompts"). An encoder's calls do not count as
ready: under a steady stream of new images its queue holds them most of the time, and pacing
then would slow every stream for first tokens that wait on the tower.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.colocation.host_backlog import BacklogBoard


@dataclass(frozen=True, slots=True)
class PacingRule:
    step_ms: float = 100.0  # 0: never yield
    max_step_ms: float = 250.0
    backlog: int = 4
    max_streams: int = 16
    ready: int = 2

    def __post_init__(self) -> None:
        if self.step_ms < 0 or min(self.backlog, self.max_streams, self.ready) < 1:
            raise ValueError(
                "yield_step_ms must be at least 0, yield_backlog, yield_max_streams and yield_ready at least 1: "
                f"{self.step_ms}, {self.backlog}, {self.max_streams}, {self.ready}"
            )
        if self.max_step_ms < self.step_ms:
            raise ValueError(f"yield_max_step_ms ({self.max_step_ms}) must be at least yield_step_ms ({self.step_ms})")


def step_interval_s(num_waiting: int, num_streams: int, rule: PacingRule, *, num_ready: int = 0) -> float:
    """The least time from one step's start to the next's, for the longest colocated queue, the
    most prompts ready on one colocated prefill node, and the streams this node holds."""
    if (num_waiting < rule.backlog and num_ready < rule.ready) or num_streams > rule.max_streams:
        return 0.0
    share = max(num_waiting / rule.backlog if num_waiting >= rule.backlog else 0.0, num_ready / rule.ready)
    return min(rule.step_ms * share, rule.max_step_ms) / 1000.0


@dataclass(slots=True)
class StepPacing:
    board: BacklogBoard
    rule: PacingRule
    num_yielding_steps: int = field(default=0, init=False)  # steps given the floor (engine thread)

    def min_interval_s(self, num_streams: int) -> float:
        interval_s = step_interval_s(self.board.max_waiting(), num_streams, self.rule, num_ready=self.board.max_ready())
        self.num_yielding_steps += interval_s > 0
        return interval_s


def step_pacing(board: BacklogBoard | None, rule: PacingRule) -> StepPacing | None:
    """The pacing of a node on ``board``; None (step freely) without a board or with a zero step."""
    if board is None or rule.step_ms == 0:
        return None
    return StepPacing(board, rule)
