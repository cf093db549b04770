"""``tessera preprocess`` as a user runs it: a real subprocess on a request file."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.factories import image_data_url, make_image


def _run(args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "services.cli.main", *args], capture_output=True, text=True, cwd=cwd, env=os.environ.copy()
    )


def test_preprocess_prints_tokens_ranges_and_hashes(tmp_path, repo_root, tiny_model):
    request = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": image_data_url(make_image(112, 84, seed=1))}},
                    {"type": "text", "text": "What is this?"},
                ],
            }
        ]
    }
    path = tmp_path / "req.json"
    path.write_text(json.dumps(request))
    proc = _run(["preprocess", "--model", "tiny", str(path), "--positions"], repo_root)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    (item,) = out["mm_items"]
    assert item["grid_thw"] == [1, 6, 8] and item["length"] == 12
    assert out["prompt_token_ids"][item["offset"] : item["offset"] + item["length"]] == [151655] * 12
    assert len(item["mm_hash"]) == 64
    assert len(out["mrope_positions"]) == 3 and len(out["mrope_positions"][0]) == out["num_prompt_tokens"]


def test_preprocess_reports_bad_input_clearly(tmp_path, repo_root, tiny_model):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": [{"type": "video", "video": "x"}]}]}))
    proc = _run(["preprocess", str(path)], repo_root)
    assert proc.returncode == 1
    assert "unsupported content part type 'video'" in proc.stderr
    path.write_text("{not json")
    proc = _run(["preprocess", str(path)], repo_root)
    assert proc.returncode == 2 and "cannot read request JSON" in proc.stderr
