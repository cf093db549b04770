#!/usr/bin/env bash
# The reference environment the oracle tests compare with (tests/reference_processors.py): the
# registry's torch and torchvision pair, as users of transformers and vLLM install it, with the
# project's own transformers, tokenizers, Pillow, NumPy and PyAV releases. The project's .venv
# cannot hold it: the local CPU torch wheel and the registry's torchvision do not import together.
# Built once (about 5 GB) and kept outside the checkout, so fresh clones reuse it; a stamp of the
# pins rebuilds it when they change. Sourced or run by deploy/run-tests.sh.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${TESSERA_REFERENCE_VENV:-$HOME/.cache/tessera/reference-venv}"
python="${PYTHON:-python3}"
pin() { grep -iE "^$1==" "$root/deploy/requirements.lock" | head -n 1; }
pins=("torch==2.13.0" "torchvision==0.28.0" "$(pin transformers)" "$(pin tokenizers)" "$(pin pillow)" "$(pin numpy)" "$(pin av)" "$(pin jinja2)")
want="$(printf '%s\n' "${pins[@]}" | sha256sum | cut -d' ' -f1)"
stamp="$venv/.tessera-reference"
if [ ! -x "$venv/bin/python" ] || [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "building the reference environment in $venv (torch and torchvision from the registry)" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  # --isolated: the machine's pip settings would offer the local CPU torch wheel, which the
  # registry's torchvision does not import beside.
  "$venv/bin/python" -m pip install --isolated -q --disable-pip-version-check "${pins[@]}"
  "$venv/bin/python" -c "import torch, torchvision, transformers" >/dev/null
  echo "$want" > "$stamp"
fi
export TESSERA_REFERENCE_VENV="$venv"
