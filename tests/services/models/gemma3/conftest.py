from __future__ import annotations

import pytest

from services.engine.config import EngineConfig
from services.engine.llm import LLM
from services.models.registry import ModelRef, resolve_model
from services.preprocess.config import PreprocessConfig
from tests.oracle import ReferenceOracle


@pytest.fixture(scope="session")
def gemma3_model() -> ModelRef:
    return resolve_model("gemma3-tiny", progress=lambda _msg: None)


@pytest.fixture(scope="session")
def gemma3_oracle(gemma3_model) -> ReferenceOracle:
    return ReferenceOracle(gemma3_model.path)


@pytest.fixture()
def make_gemma3_llm(gemma3_model):
    def factory(*, pan_and_scan: bool = False, **engine_overrides) -> LLM:
        return LLM(str(gemma3_model.path), EngineConfig(**engine_overrides), PreprocessConfig(pan_and_scan=pan_and_scan))

    return factory
