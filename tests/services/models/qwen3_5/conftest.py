from __future__ import annotations

import pytest

from services.engine.config import EngineConfig
from services.engine.llm import LLM
from services.models.registry import ModelRef, resolve_model
from tests.oracle import ReferenceOracle


@pytest.fixture(scope="session", params=["qwen3_5-tiny", "qwen3_5-moe-tiny"])
def qwen3_5_model(request) -> ModelRef:
    """Each test runs on both built-ins: dense, and a mixture of experts in every layer."""
    return resolve_model(request.param, progress=lambda _msg: None)


@pytest.fixture(scope="session")
def qwen3_5_oracle(qwen3_5_model) -> ReferenceOracle:
    return ReferenceOracle(qwen3_5_model.path)


@pytest.fixture()
def make_qwen3_5_llm(qwen3_5_model):
    def factory(**engine_overrides) -> LLM:
        return LLM(str(qwen3_5_model.path), EngineConfig(**engine_overrides))

    return factory
