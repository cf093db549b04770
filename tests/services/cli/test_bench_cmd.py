"""``tessera bench``: its help, --compare over two saved runs, and ``--suite``'s dispatch to every
suite's own parser (the smoke run of every workload against a real stack is in
tests/services/stack/test_stack_api.py; the router suite's run in tests/benchmarks/suites/)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks import suites
from services.bench import report
from services.bench.runner import RequestRecord
from services.cli.main import main


def test_help_names_every_workload(repo_root):
    out = subprocess.run([sys.executable, "-m", "services.cli.main", "bench", "--help"], cwd=repo_root, capture_output=True, text=True)
    assert out.returncode == 0
    for name in ("shared_images", "multi_turn", "long_prompts", "cold_images", "--compare", "--base-url", "--suite"):
        assert name in out.stdout


def test_compare_prints_both_runs_and_writes_one_figure(tmp_path, capsys):
    for label, ttft in (("tessera", 0.2), ("vllm", 0.5)):
        records = [RequestRecord(0, "u", True, 0.0, ttft_s=ttft, end_s=1.0, num_tokens=16)]
        report.save(report.Run(label, "cold_images", {}, 1.0, records), tmp_path / f"{label}.json")
    assert main(["bench", "--compare", str(tmp_path / "tessera.json"), str(tmp_path / "vllm.json"), "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "tessera" in printed and "vllm" in printed and "2.50x" in printed
    assert (tmp_path / "compare.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("name", suites.SUITES)
def test_every_suite_answers_help_with_its_own_arguments(name, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--suite", name, "--help"])
    assert exited.value.code == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"usage: tessera bench --suite {name} ") and "--out" in printed
    assert f"tessera bench --suite {name}" in printed.split("\n\n", 1)[1]  # the docstring shows how to run it


@pytest.mark.parametrize("argv", [[], ["bogus"], ["--model", "tiny"]])
def test_suite_must_be_named_first(argv, capsys):
    assert main(["bench", "--suite", *argv]) == 2
    assert "name one of compute, concurrency, decode_step" in capsys.readouterr().err


def test_a_suite_refuses_arguments_it_does_not_have(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--suite", "router", "--workload", "cold_images"])
    assert exited.value.code == 2
    assert "unrecognized arguments: --workload cold_images" in capsys.readouterr().err


def test_outside_a_checkout_a_suite_is_a_clear_error(tmp_path, capsys):
    from services.cli.bench_run import SuitesUnavailableError, find_suites

    with pytest.raises(SuitesUnavailableError, match="the benchmark suites live in a Tessera checkout's benchmarks/"):
        find_suites((tmp_path,))
    assert find_suites().SUITES == suites.SUITES  # from this checkout
