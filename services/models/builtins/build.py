"""``tessera models build``: write a complete, byte-reproducible built-in checkpoint directory.

The family writes the files (config, deterministic weights, tokenizer, processor, template); this
module only makes the build atomic. The directory is assembled under a temporary name and renamed
into place, so a half-built model is never visible to a concurrent reader, and a stamp written
last marks a complete build.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from services.models.family import ModelFamily, ProgressFn

BUILD_STAMP = "tessera_build.json"
BUILD_FORMAT = 2  # 2: Gemma3 built-ins gained newline-run tokens at their real ids


def _noop(_: str) -> None:
    pass


def build_builtin(name: str, family: ModelFamily, out_dir: Path, *, progress: ProgressFn = _noop) -> Path:
    """Build ``family``'s built-in model ``name`` into ``out_dir`` (replaced if it exists)."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        num_params = family.write_checkpoint(name, staging, progress)
        (staging / BUILD_STAMP).write_text(json.dumps({"format": BUILD_FORMAT, "name": name, "num_params": num_params}) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    progress(f"[{name}] done: {out_dir}")
    return out_dir


def is_complete_build(path: Path) -> bool:
    stamp = Path(path) / BUILD_STAMP
    if not stamp.is_file():
        return False
    try:
        return json.loads(stamp.read_text()).get("format") == BUILD_FORMAT
    except (OSError, json.JSONDecodeError):
        return False
