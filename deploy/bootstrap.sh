#!/usr/bin/env bash
# Create or refresh the project's virtual environment (.venv). Sourced by start.sh and run-tests.sh.
# torch is installed first and pinned exactly: a bare or looser torch pulls the CUDA build.
# torchvision is never installed: its registry build is CUDA-only and breaks imports.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
stamp="$venv/.tessera-installed"
want="$(cat "$root/pyproject.toml" "$root/deploy/requirements.lock" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "torch==2.13.0"
  # The runtime dependencies exactly as locked (the images install the same file), then the project.
  "$venv/bin/python" -m pip install -q -r "$root/deploy/requirements.lock"
  "$venv/bin/python" -m pip install -q -e "$root[test]"
  echo "$want" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}  # the built-ins need no hub; HF_HUB_OFFLINE=0 lets --model org/name download
