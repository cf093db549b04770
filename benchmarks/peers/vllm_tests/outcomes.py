"""Each vLLM entrypoint test's outcome on each server, read from the JUnit files of one run.

A failure counts as "needs a real checkpoint" only when the test is named in NEEDS_CHECKPOINT
(checkpoint_needs.py) and fails there with the symptom its entry names (the Hub out of reach)
before any assertion. An assertion that failed is a failure, listed test or not, with its message
kept: random weights that never stop, or a tokenizer that counts other tokens, fail a test as
surely as a wrong answer does, and the docs say which.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.peers.vllm_tests.checkpoint_needs import NEEDS_CHECKPOINT

OUTCOMES = ("passed", "failed", "needs_checkpoint", "skipped", "not_run")


@dataclass(slots=True)
class Outcome:
    test: str  # "chat_completion/test_chat.py::test_name[param]"
    outcome: str  # one of OUTCOMES
    reason: str | None = None  # why a real checkpoint is needed (NEEDS_CHECKPOINT)
    message: str | None = None  # the failure's first line, for every failure

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def junit_path(out: Path, target: str, file: str) -> Path:
    return out / f"{target}-{file.replace('/', '-').removesuffix('.py')}.xml"


def file_outcomes(junit: Path, file: str) -> list[Outcome]:
    """The outcome of each test of ``file`` in one JUnit file (none if the file never ran)."""
    if not junit.exists():
        return []
    return [_outcome(file, case) for case in ET.parse(junit).iter("testcase")]


def _outcome(file: str, case: ET.Element) -> Outcome:
    test = f"{file}::{case.get('name')}"
    if case.find("skipped") is not None:
        return Outcome(test, "skipped")
    problem = case.find("failure")
    problem = problem if problem is not None else case.find("error")
    if problem is None:
        return Outcome(test, "passed")
    message = (problem.get("message") or "").strip()
    text = message + "\n" + (problem.text or "")
    need = NEEDS_CHECKPOINT.get(test)
    first_line = message.splitlines()[0][:300] if message else ""
    # An assertion failed: the test reached the server and judged its answer. Whatever the
    # model's part in it, that is a failure, never a missing checkpoint.
    asserted = message.startswith("AssertionError") or "\nE       AssertionError" in (problem.text or "")
    if need is not None and not asserted and re.search(need.symptom, text):
        return Outcome(test, "needs_checkpoint", need.reason, first_line)
    return Outcome(test, "failed", None, first_line)


def counts(outcomes: list[Outcome]) -> dict[str, int]:
    return {name: sum(o.outcome == name for o in outcomes) for name in OUTCOMES if name != "not_run"}


def compare(file: str, by_target: dict[str, list[Outcome]]) -> list[dict]:
    """One record per test of ``file``: its outcome on each target ("not_run" where that target's
    run of the file did not reach it)."""
    tests = list(dict.fromkeys(o.test for outcomes in by_target.values() for o in outcomes))
    index = {target: {o.test: o for o in outcomes} for target, outcomes in by_target.items()}
    records = []
    for test in tests:
        record: dict = {"test": test}
        for target in by_target:
            found = index[target].get(test) or Outcome(test, "not_run")
            record[target] = {k: v for k, v in found.to_json().items() if k != "test"}
        records.append(record)
    return records
