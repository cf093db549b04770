"""Which of a request's outputs cross the process boundary.

A streaming client needs every token as it is made. A non-streaming one needs only the first
(gateway TTFT; the servicer sends it before adoption, outside this) and the last; every output in
between would wake the gRPC thread and the gateway for nothing, and on a 2-core machine that CPU
is taken from the decode step itself. So for a non-streaming request the engine's outputs are
folded into the last one: its ``new_token_ids`` then carries every token since the first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from services.engine.output_processor import RequestOutput
from services.engine.sampling_params import TokenLogprobs

Forward = Callable[[RequestOutput | BaseException], None]


class OutputCoalescer:
    """Called on the engine thread with each output (or an exception); forwards what to send."""

    def __init__(self, forward: Forward, *, every_output: bool) -> None:
        self._forward = forward
        self._every_output = every_output
        self._pending: list[int] = []
        self._pending_logprobs: list[TokenLogprobs] = []

    def __call__(self, output: RequestOutput | BaseException) -> None:
        if self._every_output or isinstance(output, BaseException):
            self._forward(output)
            return
        self._pending.extend(output.new_token_ids)
        self._pending_logprobs.extend(output.new_logprobs)
        if output.finished:
            self._forward(replace(output, new_token_ids=self._pending, new_logprobs=self._pending_logprobs))
            self._pending, self._pending_logprobs = [], []
