"""Session-wide setup: offline mode, an isolated TESSERA_HOME, and the built-in tiny model."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
# Reuse a caller-provided home (CI caches built models there); otherwise one per test session.
if "TESSERA_HOME" not in os.environ:
    os.environ["TESSERA_HOME"] = tempfile.mkdtemp(prefix="tessera-test-home-")

import pytest

from services.models.registry import ModelRef, resolve_model

# Its asserts report like a test's; tests outside its folder import it too (tests/deploy).
pytest.register_assert_rewrite("tests.services.stack.stack_probes")


@pytest.fixture(scope="session")
def tiny_model() -> ModelRef:
    return resolve_model("tiny", progress=lambda _msg: None)


@pytest.fixture(scope="session")
def oracle(tiny_model):
    from tests.oracle import ReferenceOracle

    return ReferenceOracle(tiny_model.path)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent
