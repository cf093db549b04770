"""The compute suite on this machine's CPU (tiny model, tiny sizes): its table, its exactness rows
against transformers and its JSON; it times every part once (the tokens are also checked in process by
tests/services/engine/test_correctness.py). The CUDA runs are in
docs/benchmarks.md."""

from __future__ import annotations

import json

from services.cli.main import main


def test_compute_suite_times_decode_and_the_tower_and_matches_transformers(tmp_path, capsys):
    out = tmp_path / "compute.json"
    argv = ["--model", "tiny", "--device", "cpu", "--batches", "1,3", "--steps", "2", "--image-sizes", "64x64"]
    argv += ["--image-batches", "2", "--repeats", "1", "--check-tokens", "4", "--out", str(out)]
    assert main(["bench", "--suite", "compute", *argv]) == 0
    printed = capsys.readouterr().out
    assert "decode width" in printed and "image request: equal" in printed and "text request: equal" in printed
    result = json.loads(out.read_text())
    assert [row["request"] for row in result["exactness"]] == ["image", "text"]
    assert all(row["equal"] and len(row["tessera"]) == 4 for row in result["exactness"])
    assert set(result["decode_step_ms"]) == {"1", "3"} and all(v > 0 for v in result["decode_step_ms"].values())
    assert list(result["vision_ms"]) == ["64x64x2"] and result["vision_ms"]["64x64x2"] > 0
