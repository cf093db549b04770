"""The zygote (services/stack/zygote.py): nodes forked from one process that loaded their common
imports, each with its own environment, reaped and reported like child processes; a stack whose
node is killed forks its replacement; --no-zygote starts every node as a new interpreter."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from services.stack.node_process import free_port, wait_serving
from services.stack.zygote import Zygote
from services.transport.internal_auth import SECRET_ENV
from tests.services.stack.conftest import launch_stack, stop_stack


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _environ(pid: int) -> dict[str, str]:
    pairs = (item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if "=" in item)
    return dict(pairs)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def _answer(running) -> str:
    client = OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=120)
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=4, temperature=0)
    return reply.choices[0].message.content


def _wait(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_zygote_forks_commands_with_their_environment_and_reports_exits_as_popen_does(tmp_path, tiny_model):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    zygote = Zygote("tiny", env)
    try:
        assert zygote.wait_ready(), zygote.error
        # Threads are set at run time, so shares may differ; a variable read as a library loads may not.
        assert zygote.forkable({**env, "OMP_NUM_THREADS": "7"})
        assert not zygote.forkable({**env, "OMP_WAIT_POLICY": "ACTIVE"})
        assert not zygote.forkable({**env, "MALLOC_ARENA_MAX": "2"})

        built = zygote.fork(["models", "build", "tiny", "--out", str(tmp_path / "tiny")], env)
        refused = zygote.fork(["serve", "--role", "no-such-role"], env)
        address = f"127.0.0.1:{free_port()}"
        server = zygote.fork(["serve", "--role", "preprocess", "--model", "tiny", "--grpc-address", address], env)
        assert _parent(built.pid) == zygote.process.pid
        assert built.wait(timeout=120) == 0 and (tmp_path / "tiny" / "config.json").is_file()
        assert refused.wait(timeout=60) == 2  # argparse's status for a bad choice
        wait_serving(address, 60, server)  # polls the forked node as it would a Popen
        assert server.poll() is None
        server.kill()
        assert server.wait(timeout=30) == -signal.SIGKILL
    finally:
        zygote.close()
    assert not zygote.alive()


@pytest.fixture(scope="module")
def forked_stack(tmp_path_factory, tiny_model, repo_root):
    running = launch_stack(tmp_path_factory.mktemp("zygote"), repo_root, internal_secret="zygote-test-secret")
    yield running
    stop_stack(running)


def test_a_stack_forks_each_node_from_its_zygote_with_the_node_s_own_share_and_secret(forked_stack):
    state = forked_stack.state()
    pids = {name: role["pid"] for name, role in state["roles"].items()}
    zygote = _parent(pids["decode"])
    assert _parent(zygote) == forked_stack.process.pid
    assert "services.stack.zygote" in Path(f"/proc/{zygote}/cmdline").read_bytes().decode()
    assert {_parent(pids[role]) for role in ("preprocess", "encoder", "prefill", "decode")} == {zygote}
    assert _parent(pids["gateway"]) == forked_stack.process.pid  # it loads none of what the nodes share
    decode, preprocess = _environ(pids["decode"]), _environ(pids["preprocess"])
    assert decode[SECRET_ENV] == preprocess[SECRET_ENV] == "zygote-test-secret"
    assert preprocess["OMP_NUM_THREADS"] == "1" and int(decode["OMP_NUM_THREADS"]) >= 1
    assert _answer(forked_stack)


def test_a_node_killed_in_a_forked_stack_is_forked_again_and_serves(forked_stack):
    before = forked_stack.state()["roles"]["decode"]["pid"]
    zygote = _parent(before)
    os.kill(before, signal.SIGKILL)
    _wait(lambda: forked_stack.state()["roles"]["decode"]["pid"] != before, 60, "the launcher did not restart the decode node")
    after = forked_stack.state()["roles"]["decode"]["pid"]
    assert _parent(after) == zygote
    _wait(lambda: _serving_after_kill(forked_stack), 60, "the replacement did not serve")
    assert _answer(forked_stack)


def _serving_after_kill(running) -> bool:
    tail = running.log_tail(200_000).split("exited with -9", 1)[-1]
    return any(" decode INFO serving " in line for line in tail.splitlines())


def test_stopping_a_forked_stack_leaves_no_process(tmp_path, tiny_model, repo_root):
    running = launch_stack(tmp_path, repo_root)
    pids = [role["pid"] for role in running.state()["roles"].values()]
    zygote = _parent(running.state()["roles"]["encoder"]["pid"])
    stop_stack(running)
    _wait(lambda: not any(_alive(pid) for pid in [*pids, zygote]), 30, "a node or the zygote outlived the launcher")


def test_without_the_zygote_each_node_is_the_launcher_s_own_child(tmp_path, tiny_model, repo_root):
    running = launch_stack(tmp_path, repo_root, "--no-zygote")
    try:
        roles = running.state()["roles"]
        assert {_parent(role["pid"]) for role in roles.values()} == {running.process.pid}
        assert httpx.get(running.base_url.removesuffix("/v1") + "/health", timeout=10).status_code == 200
        assert _answer(running)
    finally:
        stop_stack(running)
