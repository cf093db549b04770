"""``tessera bench``: its help, and --compare over two saved runs (the smoke run of every workload
against a real stack is in tests/services/stack/test_stack_e2e.py)."""

from __future__ import annotations

import subprocess
import sys

from services.bench import report
from services.bench.runner import RequestRecord
from services.cli.main import main


def test_help_names_every_workload(repo_root):
    out = subprocess.run([sys.executable, "-m", "services.cli.main", "bench", "--help"], cwd=repo_root, capture_output=True, text=True)
    assert out.returncode == 0
    for name in ("shared_images", "multi_turn", "long_prompts", "cold_images", "--compare", "--base-url"):
        assert name in out.stdout


def test_compare_prints_both_runs_and_writes_one_figure(tmp_path, capsys):
    for label, ttft in (("tessera", 0.2), ("vllm", 0.5)):
        records = [RequestRecord(0, "u", True, 0.0, ttft_s=ttft, end_s=1.0, num_tokens=16)]
        report.save(report.Run(label, "cold_images", {}, 1.0, records), tmp_path / f"{label}.json")
    assert main(["bench", "--compare", str(tmp_path / "tessera.json"), str(tmp_path / "vllm.json"), "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "tessera" in printed and "vllm" in printed and "2.50x" in printed
    assert (tmp_path / "compare.png").read_bytes()[:4] == b"\x89PNG"
