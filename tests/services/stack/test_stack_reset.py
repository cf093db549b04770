"""The reset shared stacks get between tests (stack_reset.py), on a real stack: a node a test
killed is back (the launcher restarted it) before the next test; a stack whose launcher is gone
is launched again in place, so the fixture's object serves the next test."""

from __future__ import annotations

import os
import signal

from tests.services.stack.conftest import launch_stack, relaunch, stop_stack
from tests.services.stack.e2e_helpers import client_for
from tests.services.stack.stack_probes import stack_env
from tests.services.stack.stack_reset import _alive, reset, stacks_in, wait_for


def answers(stack) -> bool:
    reply = client_for(stack).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    return reply.choices[0].message.content is not None


def test_a_killed_node_is_back_and_a_stack_without_its_launcher_is_launched_again(tmp_path, repo_root):
    stack = launch_stack(tmp_path, repo_root, env=stack_env())
    try:
        assert stacks_in([stack, (1, stack), {"a": stack}, "x"]) == [stack, stack, stack]
        decode = stack.state()["roles"]["decode"]
        os.kill(decode["pid"], signal.SIGKILL)
        # kill() returns before the process is gone; on a loaded machine it may still look alive.
        assert wait_for(lambda: not _alive(decode["pid"]), 10.0)
        assert reset(stack, relaunch) is None  # the launcher's restart: no relaunch needed
        assert stack.state()["roles"]["decode"]["restarts"] == 1 and answers(stack)
        old_url = stack.base_url
        stack.process.send_signal(signal.SIGTERM)  # the launcher stops its roles and exits
        stack.process.wait(timeout=60)
        assert "launched again" in reset(stack, relaunch)
        assert stack.base_url != old_url and stack.process.poll() is None and answers(stack)
    finally:
        stop_stack(stack)
    assert reset(stack, relaunch) is None  # a stopped stack is left alone
