"""The concurrency suite's clients split over processes (benchmarks/suites/concurrency.py), on
the session's real stack: every client streams its answer, each from its own process share, and
the wall time and peak count cover all of them. Shares the session's stack with test_stack_e2e."""

from __future__ import annotations

import argparse

from benchmarks.suites.concurrency import run_client_processes, summarize


def test_clients_split_over_processes_all_stream_their_answer(stack):
    args = argparse.Namespace(clients=7, client_processes=3, max_tokens=3, timeout_s=120.0)
    outcomes, wall_s, peak_open = run_client_processes(stack.base_url, "tiny", args)
    summary = summarize(outcomes, wall_s, peak_open)
    assert (summary["ok"], summary["connection_errors"], summary["http_errors"]) == (7, 0, 0), summary["first_error"]
    assert all(o.num_tokens >= 1 and o.ttft_s is not None and o.latency_s <= wall_s for o in outcomes)
    assert 1 <= peak_open <= 7
