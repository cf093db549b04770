"""A real multi-process stack (``tessera serve``) shared by the tests in this folder.

``launch_stack`` starts one more stack (any ``tessera serve`` flags) for tests that need their own
topology or break things on purpose; ``stop_stack`` stops it. The ``stack`` fixture is the default
one-node-per-role stack, shared by the session, with an internal secret the tests know (to call
its nodes directly). Any other stack makes its own internal secret unless ``launch_stack`` is
given one (to call its nodes directly, or add a node by hand).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import pytest
import redis

from services.stack.node_process import free_port
from services.transport.index_access import PASSWORD_ENV
from services.transport.internal_auth import SECRET_ENV, InternalAuth
from shared.index.backend import CacheIndex, IndexCredentials, create_index


@dataclass
class RunningStack:
    process: subprocess.Popen
    base_url: str
    generate_address: str
    state_file: Path
    trace_dir: Path
    log: IO[str] | None = None
    internal_secret: str | None = None  # None: the launcher made one, which the test never sees
    served_model: str = "tiny"
    index_password: str = ""  # the embedded Valkey's (every stack a test launches has one)
    launch_args: tuple = ()  # how launch_stack started it, to start it again (stack_reset.py)
    stopped: bool = False  # stop_stack ran
    seen_restarts: dict = field(default_factory=dict)  # role -> the launcher's restarts at launch or the last reset

    def internal_auth(self) -> InternalAuth:
        """Credentials for calling this stack's nodes directly."""
        assert self.internal_secret is not None, "launch_stack(internal_secret=...) to call nodes directly"
        return InternalAuth(self.internal_secret.encode())

    def node_env(self) -> dict[str, str]:
        """The environment of a node started by hand to join this stack."""
        env = {**os.environ, PASSWORD_ENV: self.index_password}
        return {**env, SECRET_ENV: self.internal_secret} if self.internal_secret else env

    def index(self, namespace: str) -> CacheIndex:
        """This stack's index, as a reader outside the cluster sees it (records unchecked)."""
        return create_index(self.state()["valkey"]["url"], namespace=namespace, credentials=IndexCredentials(password=self.index_password))

    def redis_client(self) -> redis.Redis:
        return redis.Redis.from_url(self.state()["valkey"]["url"], password=self.index_password, decode_responses=True)

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

    def log_tail(self, num_chars: int = 4000) -> str:
        return self.state_file.with_suffix(".log").read_text()[-num_chars:]


def launch_stack(
    directory: Path,
    repo_root: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    timeout_s: float = 240.0,
    internal_secret: str | None = None,
    index_password: str | None = None,
) -> RunningStack:
    """``tessera serve --model tiny <extra>`` in ``directory`` (state file, log, traces), once its
    gateway answers /health."""
    env = dict(os.environ if env is None else env)
    env.pop(SECRET_ENV, None)
    if internal_secret is not None:
        env[SECRET_ENV] = internal_secret
    env[PASSWORD_ENV] = index_password = index_password or secrets.token_urlsafe(24)
    state_file = directory / "state.json"
    trace_dir = directory / "traces"
    http_port, generate_port = free_port(), free_port()
    log = open(state_file.with_suffix(".log"), "w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.cli.main",
            "serve",
            "--model",
            "tiny",
            "--port",
            str(http_port),
            "--generate-port",
            str(generate_port),
            "--state-file",
            str(state_file),
            *extra,
        ],
        cwd=repo_root,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**env, "TESSERA_TRACE_EXPORTER": f"jsonl:{trace_dir}"},
    )
    running = RunningStack(
        process,
        f"http://127.0.0.1:{http_port}/v1",
        f"127.0.0.1:{generate_port}",
        state_file,
        trace_dir,
        log,
        internal_secret,
        index_password=index_password,
        launch_args=(directory, repo_root, extra, env, timeout_s, internal_secret, index_password),
    )
    deadline = time.monotonic() + timeout_s
    url = f"http://127.0.0.1:{http_port}"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.close()
            pytest.fail(f"tessera serve exited early:\n{running.log_tail()}")
        try:
            if state_file.exists() and httpx.get(url + "/health", timeout=5).status_code == 200:
                running.seen_restarts = {role: record["restarts"] for role, record in running.state()["roles"].items()}
                return running
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    stop_stack(running)
    pytest.fail("the stack did not become healthy in time")


def stop_stack(running: RunningStack) -> None:
    """Ctrl-C the launcher (it stops its roles, then its Valkey); kill it if it hangs."""
    running.stopped = True
    running.process.send_signal(signal.SIGINT)
    try:
        running.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        running.process.kill()
        running.process.wait()
    if running.log is not None:
        running.log.close()


def relaunch(running: RunningStack) -> None:
    """Start ``running`` again with the flags it was launched with, in place (stack_reset.py)."""
    directory, repo_root, extra, env, timeout_s, internal_secret, index_password = running.launch_args
    stop_stack(running)
    again = launch_stack(
        directory, repo_root, *extra, env=env, timeout_s=timeout_s, internal_secret=internal_secret, index_password=index_password
    )
    for name in ("process", "base_url", "generate_address", "state_file", "trace_dir", "log", "launch_args", "stopped", "seen_restarts"):
        setattr(running, name, getattr(again, name))


@pytest.fixture(autouse=True)
def _reset_shared_stacks(request):
    """After each test, every stack it used that outlives it (a module's or the session's) is
    returned to serving and idle for the next (stack_reset.py)."""
    yield
    from tests.services.stack.stack_reset import reset, stacks_in

    for running in stacks_in(request.node.funcargs.values()):
        started = time.monotonic()
        problem = reset(running, relaunch)
        if problem is not None or time.monotonic() - started > 10:
            print(f"\nstack reset after {request.node.nodeid} took {time.monotonic() - started:.1f} s: {problem or 'slow'}")


@pytest.fixture(scope="session")
def otlp_receiver():
    from tests.otlp_receiver import OtlpReceiver

    receiver = OtlpReceiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="session")
def stack(tmp_path_factory, tiny_model, repo_root, otlp_receiver):
    """The default stack, shared by test_stack_e2e, test_stack_api and test_stack_isolation; its
    spans go to a JSON-lines directory and, over OTLP, to a receiver."""
    otlp = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "200",  # ms: spans arrive while the test waits, not 5 s later
    }
    running = launch_stack(tmp_path_factory.mktemp("stack"), repo_root, env={**os.environ, **otlp}, internal_secret=secrets.token_hex(16))
    yield running
    stop_stack(running)
