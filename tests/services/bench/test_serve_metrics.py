"""Results under `vllm bench serve`'s names: TTFT, TPOT, ITL and E2EL from the chunk times of
synthetic records, goodput under SLOs, and the comparison table across the two tools."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from services.bench import report, serve_metrics
from services.bench.runner import RequestRecord


def record(index: int, ttft: float, gap: float, num_tokens: int = 5, *, error: str | None = None) -> RequestRecord:
    """A request sent at index seconds, first chunk after ttft, then one chunk every gap seconds."""
    times = [ttft + k * gap for k in range(num_tokens)]
    return RequestRecord(
        index, "u", False, float(index), ttft_s=ttft, end_s=index + times[-1], num_tokens=num_tokens, prompt_tokens=10,
        token_times_s=times, error=error,
    )  # fmt: skip


def test_ttft_tpot_itl_and_e2el_in_milliseconds():
    records = [record(0, 0.1, 0.02), record(1, 0.3, 0.04), record(2, 9.0, 9.0, error="boom")]
    result = serve_metrics.vllm_result(records, duration_s=2.0, max_concurrency=4)
    assert (result["completed"], result["failed"]) == (2, 1)
    assert result["total_input_tokens"] == 20 and result["total_output_tokens"] == 10
    assert result["request_throughput"] == 1.0 and result["output_throughput"] == 5.0 and result["total_token_throughput"] == 15.0
    assert result["mean_ttft_ms"] == pytest.approx(200.0) and result["median_ttft_ms"] == pytest.approx(200.0)
    # TPOT = (e2el - ttft) / (n - 1): exactly the chunk gap here.
    assert result["mean_tpot_ms"] == pytest.approx(30.0) and result["p99_tpot_ms"] == pytest.approx(39.8)
    assert result["mean_itl_ms"] == pytest.approx(30.0) and result["median_itl_ms"] == pytest.approx(30.0)
    assert result["mean_e2el_ms"] == pytest.approx((180.0 + 460.0) / 2)
    assert result["itls"][0] == pytest.approx([0.02] * 4) and result["errors"] == ["", "", "boom"]
    assert result["request_goodput"] is None and result["request_rate"] == "inf" and result["max_concurrency"] == 4


def test_goodput_counts_requests_within_every_slo():
    records = [record(0, 0.1, 0.02), record(1, 0.3, 0.04), record(2, 0.1, 0.2)]
    slos = serve_metrics.parse_goodput(["ttft:250", "tpot:50"])
    assert slos == {"ttft": 250.0, "tpot": 50.0}
    assert serve_metrics.vllm_result(records, 2.0, goodput_slos=slos)["request_goodput"] == 0.5  # only the first meets both
    for bad in (["ttft"], ["speed:5"], ["ttft:-1"]):
        with pytest.raises(ValueError):
            serve_metrics.parse_goodput(bad)


def test_the_run_json_carries_the_vllm_fields_and_compares_with_a_vllm_result(tmp_path):
    run = report.Run("tessera", "cold_images", {"concurrency": 4, "goodput": {"ttft": 250.0}}, 2.0, [record(0, 0.1, 0.02)])
    report.save(run, tmp_path / "tessera.json")
    saved = json.loads((tmp_path / "tessera.json").read_text())
    assert serve_metrics.is_vllm_result(saved) and saved["request_goodput"] == 0.5 and saved["records"]
    assert run.summary()["goodput_requests_per_s"] == 0.5 and run.summary()["tpot_p50_s"] == pytest.approx(0.02)
    # What `vllm bench serve --save-result` writes, trimmed to the fields compared.
    vllm = {"label": None} | {f: saved[f] * 2 for f in serve_metrics.TABLE_FIELDS if isinstance(saved.get(f), int | float)}
    (tmp_path / "vllm.json").write_text(json.dumps(vllm))
    out = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "bench", "--compare", str(tmp_path / "tessera.json"), str(tmp_path / "vllm.json")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines()[1:] if line.strip()}
    assert out.stdout.splitlines()[0].split() == ["tessera", "vllm", "ratio"]
    assert rows["median_tpot_ms"] == ["20.000", "40.000", "2.00x"] and rows["completed"] == ["1", "2", "2.00x"]
