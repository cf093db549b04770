from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.oracle import assert_tokens_match


def test_generate_prints_text_and_json_equal_to_the_oracle(tmp_path, repo_root, tiny_model, oracle):
    from tests.factories import make_image

    image = make_image(112, 84, seed=9)
    image.save(tmp_path / "img.png")
    args = [
        sys.executable,
        "-m",
        "services.cli.main",
        "generate",
        "--model",
        "tiny",
        "--image",
        str(tmp_path / "img.png"),
        "--prompt",
        "What is this?",
        "--max-tokens",
        "8",
        "--ignore-eos",
    ]
    proc = subprocess.run(args + ["--json"], capture_output=True, text=True, cwd=repo_root, env=os.environ.copy())
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]}]
    from PIL import Image

    reference = oracle.generate(oracle.process(oracle.chat_text(messages), [Image.open(tmp_path / "img.png")]), 8)
    assert_tokens_match(out["token_ids"], reference)
    assert out["usage"]["completion_tokens"] == 8 and out["finish_reason"] == "length"
    plain = subprocess.run(args, capture_output=True, text=True, cwd=repo_root, env=os.environ.copy())
    assert plain.stdout.strip() == out["text"].strip()
