from __future__ import annotations

import pytest

from services.engine.config import EngineConfig
from services.engine.llm import LLM
from services.engine.sampling_params import SamplingParams

GREEDY_16 = SamplingParams(max_tokens=16, ignore_eos=True)


@pytest.fixture()
def make_llm(tiny_model):
    def factory(**engine_overrides) -> LLM:
        return LLM(str(tiny_model.path), EngineConfig(**engine_overrides))

    return factory


def oracle_tokens(oracle, case, max_new_tokens: int = 16, **generate_kwargs):
    return oracle.generate(oracle.process(oracle.chat_text(case.oracle_messages), case.images), max_new_tokens, **generate_kwargs)
