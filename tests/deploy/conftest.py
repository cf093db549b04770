"""Fixtures every deployment test shares: the reset of a deployment a module's tests share."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _reset_shared_deployments(request):
    """After each test, every shared deployment it used (one with ``planned`` replicas) is
    restored for the next (deployment_reset.py)."""
    yield
    from tests.deploy.deployment_reset import reset

    for value in request.node.funcargs.values():
        if getattr(value, "planned", None) is not None and (problem := reset(value)) is not None:
            print(f"\ndeployment reset after {request.node.nodeid}: {problem}")
