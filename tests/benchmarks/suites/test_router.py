"""The router suite end to end at tiny sizes: an embedded Valkey, a checked route, its table and
JSON (a few seconds)."""

from __future__ import annotations

import json

from services.bench.portable import portable
from services.cli.main import main


def test_router_suite_prints_its_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "router.json"
    argv = ["bench", "--suite", "router", "--prompt-tokens", "256", "--decisions", "20", "--idle-nodes", "0,30", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "prompt tokens" in printed and "given p99" in printed and f"wrote {out}" in printed
    result = json.loads(out.read_text())
    assert result["benchmark"] == "router"
    # The result names no path of this machine (services/bench/portable.py).
    assert result["command"] == portable(f"tessera bench --suite router --prompt-tokens 256 --decisions 20 --idle-nodes 0,30 --out {out}")
    assert str(out) not in result["command"]
    assert [r["nodes"] for r in result["results"]] == [6, 36]
    for row in result["results"]:
        assert row["blocks"] == 16 and row["decisions"] == 20
        assert 0 < row["p50_ms"] <= row["p99_ms"] and 0 < row["hashes_given"]["p50_ms"]
