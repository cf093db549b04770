"""The scripts in benchmarks/ are thin wrappers: each runs one ``tessera bench --suite``, and every
suite has its script."""

from __future__ import annotations

import re

from benchmarks import suites


def test_every_benchmark_script_only_calls_the_cli(repo_root):
    scripts = sorted((repo_root / "benchmarks").glob("*_bench.py"))
    named = {}
    for script in scripts:
        text = script.read_text()
        assert len(text.splitlines()) <= 15, script.name
        assert "from services.cli.main import main" in text, script.name
        (suite,) = re.findall(r'main\(\["bench", "--suite", "(\w+)", \*sys\.argv\[1:\]\]\)', text)
        named[script.name] = suite
    assert {f"{suite}_bench.py": suite for suite in suites.SUITES} == named
    assert {p.name for p in (repo_root / "benchmarks").glob("*.py")} - set(named) == {"__init__.py"}
