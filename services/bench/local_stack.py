"""A `tessera serve` stack as a subprocess of a benchmark: launch it, wait for the gateway's
/health, read its /metrics, and stop it the way Ctrl-C would. ``tessera bench`` uses it when no
endpoint is given, and so do its suites (benchmarks/suites/)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import httpx

from services.stack.node_process import free_port

ROOT = Path(__file__).resolve().parent.parent.parent


def launch(model: str, port: int, extra: list[str], log: IO | None = None) -> subprocess.Popen:
    """``tessera serve --model model --port port`` plus ``extra``; output to ``log`` (None: discarded)."""
    command = [sys.executable, "-m", "services.cli.main", "serve", "--model", model, "--port", str(port)]
    command += ["--generate-port", str(free_port())]
    output = subprocess.DEVNULL if log is None else log
    stderr = subprocess.DEVNULL if log is None else subprocess.STDOUT
    return subprocess.Popen([*command, *extra], cwd=ROOT, stdout=output, stderr=stderr, env=os.environ.copy())


def start_stack(model: str, extra: list[str], log_path: Path | None = None, timeout_s: float = 600) -> tuple[subprocess.Popen, str]:
    """Launch a stack; (launcher process, /v1 URL) once /health is 200. Stopped again if that fails."""
    port = free_port()
    if log_path is None:
        process = launch(model, port, extra)
    else:
        with open(log_path, "w") as log:
            process = launch(model, port, extra, log)
    try:
        wait_healthy(process, f"http://127.0.0.1:{port}", timeout_s)
    except BaseException:
        stop_stack(process)
        raise
    return process, f"http://127.0.0.1:{port}/v1"


def wait_healthy(process: subprocess.Popen, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"tessera serve exited early (rc {process.returncode})")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the stack did not become healthy in {timeout_s:.0f}s")


def stop_stack(process: subprocess.Popen, timeout_s: float = 60) -> None:
    """Ctrl-C the launcher (it stops its roles, then its Valkey); kill it if it hangs."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=timeout_s)


def scrape_metrics(base_url: str) -> dict[str, float]:
    """The gateway's Prometheus text as {series: value}; {} when there is none."""
    try:
        response = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=30)
    except httpx.HTTPError:
        return {}
    if response.status_code != 200:
        return {}
    out = {}
    for line in response.text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out
