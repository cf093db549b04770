"""The reset every stack shared between tests gets after each test that used it, so the next one
starts from a serving, idle stack whatever the last one did:
  * the launcher's own restarts bring back a node a test killed: wait (bounded) until every node
    the launcher lists is alive and the gateway answers /health;
  * a stream a test left open, or a request still running, ends: wait until the gateway has no
    request in flight;
  * a stack whose launcher died, or that never gets healthy again, is launched again in place (the
    same flags, in the same directory), so the fixture's object stays valid for the next test.
Caches are not cleared: tests that need a cold cache use images of their own (unique seeds)."""

from __future__ import annotations

import time

import httpx

HEALTHY_WITHIN_S = 60.0
IDLE_WITHIN_S = 30.0
IN_FLIGHT = "tessera_requests_in_flight"


def stacks_in(values) -> list:
    """The running stacks among a test's fixture values (directly, or in a tuple, list or dict)."""
    from tests.services.stack.conftest import RunningStack

    found = []
    for value in values:
        items = value.values() if isinstance(value, dict) else value if isinstance(value, tuple | list) else (value,)
        found += [item for item in items if isinstance(item, RunningStack)]
    return found


def reset(stack, relaunch) -> str | None:
    """Return ``stack`` to serving and idle; what was wrong with it, or None."""
    if stack.stopped:
        return None
    if stack.process.poll() is not None:
        relaunch(stack)
        return f"its launcher had exited ({stack.process.returncode}): launched again"
    if not wait_for(lambda: _healthy(stack), HEALTHY_WITHIN_S):
        relaunch(stack)
        return f"not healthy within {HEALTHY_WITHIN_S:g} s: launched again"
    restarts = {role: record["restarts"] for role, record in stack.state()["roles"].items()}
    if restarts != stack.seen_restarts:
        # A node came back since the last reset: alive is not yet registered and routed to, so
        # wait until the stack answers (this probe is the only request a reset sends).
        stack.seen_restarts = restarts
        if not wait_for(lambda: answers(stack), HEALTHY_WITHIN_S):
            relaunch(stack)
            return f"a restarted node was not served within {HEALTHY_WITHIN_S:g} s: launched again"
    if not wait_for(lambda: stack.metrics().get(IN_FLIGHT, 0.0) == 0.0, IDLE_WITHIN_S):
        return f"requests still in flight after {IDLE_WITHIN_S:g} s"
    return None


def answers(stack) -> bool:
    body = {"model": stack.served_model, "prompt": "hi", "max_tokens": 1}
    try:
        return httpx.post(stack.base_url + "/completions", json=body, timeout=30).status_code == 200
    except httpx.HTTPError:
        return False


def _healthy(stack) -> bool:
    """Every node the launcher lists is alive (a killed one restarted; not asked of a stack
    launched with --no-restart, whose tests leave nodes dead on purpose), and the gateway is
    healthy (every role has a live node)."""
    try:
        roles = stack.state()["roles"].values()
        restarts = "--no-restart" not in (stack.launch_args[2] if stack.launch_args else ())
        if restarts and not all(_alive(role["pid"]) for role in roles):
            return False
        return httpx.get(stack.base_url.removesuffix("/v1") + "/health", timeout=5).status_code == 200
    except (httpx.HTTPError, OSError, ValueError, KeyError):  # a state file mid-write, a gateway mid-restart
        return False


def _alive(pid: int) -> bool:
    """Running, not a zombie its launcher has yet to reap."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(condition, timeout_s: float, poll_s: float = 0.2) -> bool:
    """Whether ``condition()`` came true within ``timeout_s`` (polled every ``poll_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
