"""The router suite end to end at tiny sizes: an embedded Valkey, a checked route, its table and
JSON (a few seconds)."""

from __future__ import annotations

import json

from services.cli.main import main


def test_router_suite_prints_its_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "router.json"
    assert main(["bench", "--suite", "router", "--prompt-tokens", "256", "--decisions", "20", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "prompt tokens" in printed and "(hashes given)" in printed and f"wrote {out}" in printed
    result = json.loads(out.read_text())
    assert result["benchmark"] == "router"
    assert result["command"] == f"tessera bench --suite router --prompt-tokens 256 --decisions 20 --out {out}"
    assert result["results"]["blocks"] == 16 and result["results"]["decisions"] == 20
    assert 0 < result["results"]["p50_ms"] <= result["results"]["p99_ms"]
    assert 0 < result["results"]["hashes_given"]["p50_ms"]
