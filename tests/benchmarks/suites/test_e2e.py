"""The e2e suite against a `tessera serve` it starts (tiny model, tiny sizes) and the engine: its
table and JSON, against a stack it starts."""

from __future__ import annotations

import json

from services.cli.main import main


def test_e2e_suite_against_a_stack_it_starts(tmp_path, capsys):
    out = tmp_path / "e2e.json"
    argv = ["--model", "tiny", "--requests", "2", "--max-tokens", "4", "--image-size", "64x64", "--out", str(out)]
    assert main(["bench", "--suite", "e2e", *argv]) == 0
    assert "stack (s)" in capsys.readouterr().out
    results = json.loads(out.read_text())["results"]
    assert results["http_cold_median_s"] > 0 and results["engine_cached_median_s"] > 0 and results["cold_ratio"] > 0
