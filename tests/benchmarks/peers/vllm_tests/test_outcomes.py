"""Per-test outcomes of vLLM's entrypoint tests from JUnit files: a failure needs a checkpoint
only when the test is named with that symptom; anything else is a failure, message kept."""

from __future__ import annotations

from pathlib import Path

from benchmarks.peers.vllm_tests import outcomes
from benchmarks.peers.vllm_tests.checkpoint_needs import HUB, NEEDS_CHECKPOINT, Need

FILE = "chat_completion/test_chat.py"


def junit(path: Path, cases: dict[str, str | None]) -> Path:
    """A JUnit file whose cases pass (None), are skipped ("skip") or fail with the given message."""
    body = []
    for name, failure in cases.items():
        inner = (
            "" if failure is None else '<skipped message="x"/>' if failure == "skip" else f'<failure message="{failure}">trace</failure>'
        )
        body.append(f'<testcase classname="tests.entrypoints.openai.chat_completion.test_chat" name="{name}">{inner}</testcase>')
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{"".join(body)}</testsuite></testsuites>')
    return path


def test_a_listed_test_needs_the_checkpoint_only_with_its_symptom_and_never_on_an_assertion(tmp_path, monkeypatch):
    needs = {
        f"{FILE}::test_hub": Need("loads a tokenizer", HUB),
        f"{FILE}::test_asserts": Need("loads a tokenizer", HUB),
        f"{FILE}::test_stops": Need("random weights never stop", "length"),
    }
    monkeypatch.setattr(outcomes, "NEEDS_CHECKPOINT", needs)
    cases = {
        "test_hub": "OSError: We couldn't connect to 'https://huggingface.co' to load the files",
        "test_asserts": "AssertionError: assert 3 == 4",  # listed, but the test judged an answer
        "test_stops": "AssertionError: assert 'length' == 'stop'",  # its symptom, yet an assertion
        "test_other": "OSError: couldn't connect to huggingface.co",  # not listed: a failure
        "test_ok": None,
        "test_skip": "skip",
    }
    found = {o.test.split("::")[1]: o for o in outcomes.file_outcomes(junit(tmp_path / "a.xml", cases), FILE)}
    assert found["test_hub"].outcome == "needs_checkpoint" and found["test_hub"].reason == "loads a tokenizer"
    assert found["test_asserts"].outcome == "failed" and found["test_asserts"].message == "AssertionError: assert 3 == 4"
    assert found["test_stops"].outcome == "failed" and found["test_other"].outcome == "failed"
    assert (found["test_ok"].outcome, found["test_skip"].outcome) == ("passed", "skipped")
    assert outcomes.counts(list(found.values())) == {"passed": 1, "failed": 3, "needs_checkpoint": 1, "skipped": 1}


def test_each_test_gets_its_outcome_on_each_server_and_a_missing_run_is_not_run(tmp_path):
    ours = outcomes.file_outcomes(junit(tmp_path / "t.xml", {"test_a": None, "test_b": "AssertionError: x"}), FILE)
    theirs = outcomes.file_outcomes(junit(tmp_path / "v.xml", {"test_a": None}), FILE)
    records = outcomes.compare(FILE, {"tessera": ours, "vllm": theirs})
    assert records == [
        {"test": f"{FILE}::test_a", "tessera": {"outcome": "passed"}, "vllm": {"outcome": "passed"}},
        {"test": f"{FILE}::test_b", "tessera": {"outcome": "failed", "message": "AssertionError: x"}, "vllm": {"outcome": "not_run"}},
    ]
    assert outcomes.file_outcomes(tmp_path / "never.xml", FILE) == []


def test_every_named_need_has_a_reason_and_a_symptom():
    for test, need in NEEDS_CHECKPOINT.items():
        assert "::" in test and test.split("::")[0].endswith(".py"), test
        assert need.reason and need.symptom, test


def test_one_run_summary_counts_per_file_and_names_the_tests_whose_outcomes_differ(tmp_path):
    from benchmarks.peers.vllm_tests.run import summarize

    junit(outcomes.junit_path(tmp_path, "tessera", FILE), {"test_a": None, "test_b": "AssertionError: x"})
    junit(outcomes.junit_path(tmp_path, "vllm", FILE), {"test_a": None, "test_b": None})
    runs = [{"file": FILE, "target": "tessera", "seconds": 12, "timed_out": False}]
    summary = summarize(tmp_path, [FILE], ["tessera", "vllm"], runs)
    assert summary["files"][0] == {"file": FILE, "target": "tessera", "passed": 1, "failed": 1, "needs_checkpoint": 0, "skipped": 0} | {
        "seconds": 12,
        "timed_out": False,
    }
    assert summary["files"][1]["passed"] == 2 and summary["differ"] == [f"{FILE}::test_b"]
