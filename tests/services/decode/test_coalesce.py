"""Which decode outputs are forwarded to the gateway (pure)."""

from __future__ import annotations

from services.decode.coalesce import OutputCoalescer
from services.engine.output_processor import RequestOutput


def _output(token: int, finished: bool = False) -> RequestOutput:
    return RequestOutput("r", [token], [], f"t{token}", finished, "length" if finished else None, 10, 0)


def _run(outputs, *, every_output: bool):
    sent = []
    coalescer = OutputCoalescer(sent.append, every_output=every_output)
    for output in outputs:
        coalescer(output)
    return sent


def test_streaming_forwards_every_output_unchanged():
    outputs = [_output(1), _output(2), _output(3, finished=True)]
    assert [o.new_token_ids for o in _run(outputs, every_output=True)] == [[1], [2], [3]]


def test_non_streaming_forwards_only_the_last_with_every_token_since_the_first():
    # The engine's outputs after the first token (which the servicer sent before adoption).
    sent = _run([_output(2), _output(3), _output(4, finished=True)], every_output=False)
    assert [o.new_token_ids for o in sent] == [[2, 3, 4]]
    assert sent[-1].finished and sent[-1].text == "t4"


def test_errors_are_forwarded_at_once():
    error = RuntimeError("boom")
    sent = _run([_output(1), _output(2), error], every_output=False)
    assert sent == [error]
