"""The simulate suite end to end at tiny sizes: real embedded Valkey, the real router, modelled
compute; its table, goals and JSON (seconds)."""

from __future__ import annotations

import json

from services.bench.portable import portable
from services.cli.main import main


def test_simulate_suite_compares_the_policies_and_loses_no_request(tmp_path, capsys):
    out = tmp_path / "simulate.json"
    assert main(["bench", "--suite", "simulate", "--quick", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "tower/img" in printed and "growth" in printed and "goals at 12 nodes" in printed and f"wrote {out}" in printed
    result = json.loads(out.read_text())
    assert result["benchmark"] == "simulate" and result["command"] == portable(f"tessera bench --suite simulate --quick --out {out}")
    rows = {(r["policy"], r["nodes"]): r for r in result["results"]}
    assert set(rows) == {(p, n) for p in ("cache_aware", "round_robin", "llmd") for n in (6, 12)}
    for row in rows.values():
        assert row["finished"] and row["lost"] == row["unfinished"] == 0 and row["completed"] == row["requests"] > 0
        assert row["churn"] == {"joins": 1, "kills": 1, "drains": 1}
        for key in ("tower_runs_per_distinct_image", "prefill_tokens_per_novel_token", "ttft_p50_s", "ttft_p99_s", "compute_hit_rate"):
            assert row[key] is not None and row[key] >= 0, key
        assert 0 < row["decision_p50_ms"] <= row["decision_p99_ms"]
        assert row["index"]["server_commands"] > 0 and row["index"]["bytes"] > 0
        steady = row["index_steady"]  # up to the last session's arrival: fewer requests, less virtual time
        assert 0 < steady["requests"] <= row["requests"] and 0 < steady["until_s"] < row["virtual_s"] and steady["server_commands"] > 0
        assert row["index_memory"]["mib_per_million_entries"] > 0
        assert row["prefill_tokens_per_novel_token"] >= 1.0 - 1e-9
    for nodes in (6, 12):
        ours, baseline = rows[("cache_aware", nodes)], rows[("round_robin", nodes)]
        assert ours["tower_runs_per_distinct_image"] <= baseline["tower_runs_per_distinct_image"]
        assert ours["lookup"]["lookups"] > 0 and ours["lookup"]["server_commands"] > 0 and baseline["lookup"] is None
        assert baseline["index"]["by_client"]["router"]["commands"] == 0  # round_robin: no cache lookups
    assert set(result["growth"]) == {"cache_aware", "round_robin", "llmd"}
    assert {"decision_p99_ms", "index_work_growth", "tower_runs_per_distinct_image", "hit_rate_vs_round_robin"} <= set(result["goals"])
