"""The Node.js example client (protos/examples/node) against a real Generate server: a second
language's types come from protos/tessera.proto and speak the same contract. Skipped where Node
or its npm packages cannot be had."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

import grpc
import pytest

from services.gateway.generate.server import GenerateServicer, start_generate_server
from services.stack.node_process import free_port
from tests.services.gateway.http.test_app import FakePipeline, frontend_for

CLIENT_DIR = Path(__file__).resolve().parents[4] / "protos" / "examples" / "node"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tessera" / "node-generate-client"


@pytest.fixture(scope="module")
def node_modules() -> Path:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed")
    package = (CLIENT_DIR / "package.json").read_text()
    if not (CACHE / "node_modules").is_dir() or (CACHE / "package.json").read_text() != package:
        CACHE.mkdir(parents=True, exist_ok=True)
        (CACHE / "package.json").write_text(package)
        try:
            subprocess.run(
                ["npm", "install", "--no-audit", "--no-fund", "--silent"], cwd=CACHE, check=True, capture_output=True, timeout=300
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"npm could not install the client's packages: {exc}")
    return CACHE / "node_modules"


def run_client(node_modules: Path, *args: str) -> subprocess.CompletedProcess:
    address = f"127.0.0.1:{free_port()}"
    pipeline = FakePipeline()

    async def scenario() -> tuple[int, bytes, bytes]:
        server = await start_generate_server(GenerateServicer(frontend_for(pipeline, default_max_tokens=8)), address)
        try:
            process = await asyncio.create_subprocess_exec(
                "node",
                str(CLIENT_DIR / "generate_client.js"),
                address,
                *args,
                env={**os.environ, "NODE_PATH": str(node_modules)},
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(process.communicate(), 60)
            return process.returncode or 0, out, err
        finally:
            await server.stop(grace=None)

    returncode, out, err = asyncio.run(scenario())
    return subprocess.CompletedProcess(args, returncode, out.decode(), err.decode())


def test_the_node_client_streams_typed_choices(node_modules):
    result = run_client(node_modules, "Say hello.", "--n", "2", "--image", "https://example.com/cat.png")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    final = lines[-1]
    assert final["texts"] == {"0": "Hello there friend", "1": "Hello there friend"} and final["request_id"].startswith("gen-")
    last_chunks = [line for line in lines[:-1] if line["finish_reason"]]
    assert len(last_chunks) == 2 and all(c["usage"]["completion_tokens"] == 3 for c in last_chunks)


def test_the_node_client_reports_the_status_of_a_refused_call(node_modules):
    result = run_client(node_modules, "Say hello.", "--model", "gpt-4")
    assert result.returncode == 1 and result.stderr.startswith(grpc.StatusCode.NOT_FOUND.name)
