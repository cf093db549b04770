"""The startup suite on a `tiny` 1/1/1 stack it starts: every start counted, each role's serving
time read from the nodes' own log lines, and a SIGKILLed node of each role replaced."""

from __future__ import annotations

import json

import pytest

from benchmarks.suites.startup import _parse, _summary
from services.cli.main import main


def test_a_config_names_the_model_the_counts_and_whether_the_zygote_forks():
    assert _parse("tiny:2/1/3") == ("tiny", {"preprocess": 2, "encoder": 1, "prefill": 3, "decode": 3}, True)
    assert _parse("small:1/1/1:no-zygote")[2] is False
    with pytest.raises(SystemExit, match="PREPROCESS/ENCODERS/PREFILL"):
        _parse("tiny:1/1")


def test_a_start_that_never_became_healthy_is_counted_not_dropped():
    starts = [{"healthy_s": 7.0, "node_serving_s": {"decode": [1.0]}, "replacement_s": {}}]
    starts.append({"healthy_s": None, "error": "TimeoutError", "node_serving_s": {}, "replacement_s": {}})
    summary = _summary(starts)
    assert summary["num_starts"] == 2 and summary["num_failed"] == 1 and summary["healthy_s_median"] == 7.0


def test_startup_suite_times_a_stack_its_nodes_and_their_replacements(tmp_path, capsys, tiny_model):
    out = tmp_path / "startup.json"
    assert main(["bench", "--suite", "startup", "--configs", "tiny:1/1/1", "--runs", "1", "--out", str(out)]) == 0
    assert "replaced after SIGKILL" in capsys.readouterr().out
    [config] = json.loads(out.read_text())["configs"]
    [start] = config["starts"]
    assert start["error"] is None and config["num_failed"] == 0 and start["healthy_s"] > 0
    assert set(start["node_serving_s"]) == set(start["replacement_s"]) == {"preprocess", "encoder", "prefill", "decode"}
    assert all(0 < seconds < 120 for seconds in start["replacement_s"].values())
