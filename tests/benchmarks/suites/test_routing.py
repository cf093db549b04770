"""The routing suite's pure parts: its workload (the shared_images workload with N images x Q
questions), its client summary and server counters, its --policies check; and one policy
on a tiny 2/2/2 stack."""

from __future__ import annotations

import argparse
import json

import pytest

from benchmarks import suites
from benchmarks.suites import routing
from services.bench.runner import RequestRecord
from services.cli.main import main


def _args(*argv: str) -> argparse.Namespace:
    return suites.parser("routing").parse_args(list(argv))


def test_workload_asks_every_question_of_every_image_round_by_round():
    requests = routing.workload(_args("--images", "3", "--questions", "2", "--image-size", "32x32"))
    images = [r.messages[0]["content"][0]["image_url"]["url"] for r in requests]
    assert len(requests) == 6 and len(set(images)) == 3
    assert set(images[:3]) == set(images[3:])  # round 2 repeats every image of round 1
    assert [r.first_touch for r in requests] == [True] * 3 + [False] * 3
    warm = {r.messages[0]["content"][0]["image_url"]["url"] for r in routing.warmup(_args("--warmup", "2", "--image-size", "32x32"))}
    assert not warm & set(images)


def test_client_summary_leaves_failures_out_of_latencies():
    records = [
        RequestRecord(0, "u", True, 0.0, ttft_s=0.1, end_s=1.0, num_tokens=8, prompt_tokens=100),
        RequestRecord(1, "u", False, 0.5, ttft_s=0.3, end_s=2.5, num_tokens=8, prompt_tokens=100),
        RequestRecord(2, "u", False, 2.0, error="run deadline passed"),
    ]
    summary = routing.client_summary(records, wall_s=4.0)
    assert summary["requests"] == 3 and summary["errors"] == 1 and summary["first_error"] == "run deadline passed"
    assert summary["ttft_p50_ms"] == pytest.approx(300) and summary["latency_p50_ms"] == pytest.approx(2000)
    assert summary["prompt_tokens"] == 200 and summary["output_tokens_per_s"] == 4.0 and summary["requests_per_s"] == 0.5


def test_server_summary_takes_counter_deltas_per_image_and_prompt_token():
    before = {"tessera_encoder_items_encoded_total": 2.0}
    after = {"tessera_encoder_items_encoded_total": 14.0, "tessera_prefill_tokens_computed_total": 50.0}
    summary = routing.server_summary(before, after, num_images=12, prompt_tokens=200)
    assert summary == {
        "encoder_runs": 12.0,
        "prefill_tokens_computed": 50.0,
        "encoder_runs_per_image": 1.0,
        "prefill_computed_per_prompt_token": 0.25,
    }


def test_policies_are_checked_when_parsed(capsys):
    assert _args("--policies", "round_robin, cache_aware").policies == ["round_robin", "cache_aware"]
    assert _args().policies == ["cache_aware", "round_robin"]
    with pytest.raises(SystemExit):
        _args("--policies", "fastest")
    assert "choose from" in capsys.readouterr().err


def test_routing_suite_on_one_policy(tmp_path, capsys):
    out = tmp_path / "routing.json"
    argv = ["--model", "tiny", "--policies", "cache_aware", "--images", "2", "--questions", "2", "--max-tokens", "4"]
    argv += ["--image-size", "64x64", "--warmup", "1", "--router-decisions", "10", "--log-dir", str(tmp_path), "--out", str(out)]
    assert main(["bench", "--suite", "routing", *argv]) == 0
    assert "ttft p50 ms" in capsys.readouterr().out
    result = json.loads(out.read_text())
    (row,) = result["results"]
    assert row["policy"] == "cache_aware" and row["requests"] == 4 and row["errors"] == 0 and row["prompt_tokens"] > 0
    assert row["encoder_runs_per_image"] >= 1 and result["router_decision"]["decisions"] == 10
