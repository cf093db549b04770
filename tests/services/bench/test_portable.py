"""Result files name no path of the machine that wrote them (services/bench/portable.py): what the
writers write, and every committed result."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from services.bench.portable import CHECKOUT, portable, rewrite_json, write_json

# A home directory, a checkout or a temporary folder, as an absolute path in a JSON string.
MACHINE_PATH = re.compile(r"(?<![\w.~<>-])/(?:root|home/[^/\s\"]+|tmp|var/tmp|work)(?:/|\b)|" + re.escape(str(CHECKOUT)))


def test_paths_of_the_checkout_the_temporary_folder_and_home_become_placeholders(tmp_path):
    home, temporary = str(Path.home()), tempfile.gettempdir()
    result = {
        "out": f"{CHECKOUT}/benchmarks/results/x.json",
        "state": f"{temporary}/stack-1/state.json",
        "tokenizer_id": f"{home}/.cache/tessera/models/small",
        "nested": [{"cmd": f"tessera bench --out {temporary}/b41/x.json"}],
        "count": 3,
    }
    assert portable(result) == {
        "out": "<checkout>/benchmarks/results/x.json",
        "state": "<tmp>/stack-1/state.json",
        "tokenizer_id": "~/.cache/tessera/models/small",
        "nested": [{"cmd": "tessera bench --out <tmp>/b41/x.json"}],
        "count": 3,
    }
    write_json(tmp_path / "a.json", result)
    (tmp_path / "b.json").write_text(json.dumps(result))  # as vLLM's client writes it
    rewrite_json(tmp_path / "b.json")
    for name in ("a.json", "b.json"):
        text = (tmp_path / name).read_text()
        assert home not in text and temporary not in text and str(CHECKOUT) not in text


def test_no_committed_result_names_a_path_of_the_machine_that_wrote_it(repo_root):
    found = [
        str(path.relative_to(repo_root))
        for path in sorted((repo_root / "benchmarks" / "results").rglob("*"))
        if path.is_file() and path.suffix in (".json", ".jsonl", ".md", ".txt", ".csv", ".log") and MACHINE_PATH.search(path.read_text())
    ]
    assert found == []
