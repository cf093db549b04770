"""The reset a deployment shared by a module's tests gets after each test that used it (the
network-namespace deployments of test_netns_hosts.py), as stack_reset.py gives local stacks: a
replica a test killed is started again (compose's restart policy, which the process emulation
does not run by itself), then the gateway must be healthy (every role with a live node) and have
no request in flight, each within a bound."""

from __future__ import annotations

import httpx

from tests.services.stack.stack_reset import wait_for

HEALTHY_WITHIN_S = 120.0
IDLE_WITHIN_S = 30.0


def reset(deployment) -> str | None:
    """Restore ``deployment`` (its ``compose`` and ``planned`` replicas per service); what was wrong, or None."""
    compose, restored = deployment.compose, []
    for service, replicas in deployment.planned.items():
        for _ in range(replicas - len(compose.replicas(service))):
            compose.add_replica(service, {})  # once healthy (scale() would trip on the killed one)
            restored.append(service)
    if not wait_for(lambda: _status(compose.gateway_url + "/health") == 200, HEALTHY_WITHIN_S, 0.5):
        return f"gateway not healthy within {HEALTHY_WITHIN_S:g} s"
    if not wait_for(lambda: _in_flight(compose.gateway_url) == 0.0, IDLE_WITHIN_S, 0.5):
        return f"requests still in flight after {IDLE_WITHIN_S:g} s"
    return f"restarted {', '.join(restored)}" if restored else None


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.HTTPError:
        return None


def _in_flight(gateway_url: str) -> float | None:
    try:
        text = httpx.get(gateway_url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    line = next((line for line in text.splitlines() if line.startswith("tessera_requests_in_flight ")), None)
    return float(line.split()[1]) if line else 0.0
