"""Overload on a real stack: every node takes one call at a time (``--max-pending-requests 1``),
and a burst of concurrent streams arrives. The node that is full refuses the call as busy, the
gateway finds no other node of that role, and the client gets OpenAI's 429 with ``Retry-After``,
never a dropped connection or a 5xx. The admitted streams finish intact, and once the burst is
over the stack serves normally, with no node counted as failed."""

from __future__ import annotations

import threading

import pytest
from openai import OpenAI, RateLimitError

from tests.services.stack.conftest import launch_stack, stop_stack

NUM_CLIENTS = 8


@pytest.fixture(scope="module")
def narrow_stack(tmp_path_factory, repo_root):
    running = launch_stack(tmp_path_factory.mktemp("overload"), repo_root, "--max-pending-requests", "1")
    yield running
    stop_stack(running)


def _stream(client: OpenAI, start: threading.Barrier, outcomes: list) -> None:
    start.wait(timeout=60)
    try:
        stream = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Count slowly to one hundred."}],
            max_tokens=48,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        num_tokens = sum(1 for chunk in stream if chunk.choices and chunk.choices[0].delta.content)
        outcomes.append(("ok", num_tokens))
    except RateLimitError as exc:
        outcomes.append(("429", exc.response.headers.get("retry-after"), exc.body))
    except Exception as exc:  # any other outcome is the failure this test looks for
        outcomes.append(("error", repr(exc)))


def test_a_burst_past_every_nodes_limit_gets_429s_and_the_rest_finish(narrow_stack):
    client = OpenAI(base_url=narrow_stack.base_url, api_key="unused", max_retries=0, timeout=120)
    failures_before = narrow_stack.metrics().get("tessera_gateway_node_failures_total", 0.0)
    start, outcomes = threading.Barrier(NUM_CLIENTS), []
    threads = [threading.Thread(target=_stream, args=(client, start, outcomes)) for _ in range(NUM_CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert len(outcomes) == NUM_CLIENTS
    assert not [o for o in outcomes if o[0] == "error"], outcomes
    refused = [o for o in outcomes if o[0] == "429"]
    served = [o for o in outcomes if o[0] == "ok"]
    assert refused and served, outcomes
    for _, retry_after, body in refused:
        assert retry_after == "1"
        assert body["code"] == "rate_limit_exceeded" and "at its limit" in body["message"]
    assert all(num_tokens > 0 for _, num_tokens in served)

    metrics = narrow_stack.metrics()
    assert metrics["tessera_gateway_node_busy_refusals_total"] >= len(refused)
    assert metrics.get("tessera_gateway_node_failures_total", 0.0) == failures_before  # busy is not broken
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello"}], max_tokens=4, temperature=0)
    assert reply.choices[0].finish_reason in ("length", "stop")
