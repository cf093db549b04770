"""A real multi-process stack (``tessera serve``) shared by the tests in this folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from services.stack.launcher import free_port


@dataclass
class RunningStack:
    process: subprocess.Popen
    base_url: str
    generate_address: str
    state_file: Path
    trace_dir: Path

    def state(self) -> dict:
        return json.loads(self.state_file.read_text())

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.base_url.removesuffix("/v1") + "/metrics", timeout=30).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model, repo_root):
    state_file = tmp_path_factory.mktemp("stack") / "state.json"
    trace_dir = state_file.parent / "traces"
    http_port, generate_port = free_port(), free_port()
    log = open(state_file.with_suffix(".log"), "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "serve", "--model", "tiny", "--port", str(http_port), "--generate-port", str(generate_port), "--state-file", str(state_file)],
        cwd=repo_root, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "TESSERA_TRACE_EXPORTER": f"jsonl:{trace_dir}"},
    )
    deadline = time.monotonic() + 240
    url = f"http://127.0.0.1:{http_port}"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"tessera serve exited early:\n{state_file.with_suffix('.log').read_text()[-4000:]}")
        try:
            if state_file.exists() and httpx.get(url + "/health", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    else:
        process.kill()
        pytest.fail("the stack did not become healthy in time")
    yield RunningStack(process, url + "/v1", f"127.0.0.1:{generate_port}", state_file, trace_dir)
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
    log.close()
