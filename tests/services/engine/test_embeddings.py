"""Embedding requests in the engine (services/engine/pooler.py): the last prompt token's final
hidden state, normalized, equals transformers' within 1e-5 (text, images, a video), cold, on a
prefix hit and in chunks;
CLS and MEAN pooling (a sentence-transformers layout) read every prompt row, on a whole-prompt
recompute; ``dimensions`` is refused where the model is no Matryoshka model."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from services.engine.engine import RequestRejectedError
from services.engine.llm import LLM
from services.engine.sampling_params import SamplingParams
from tests.factories import Video, chat_case, encode_image, make_clip, make_image
from tests.video_oracle import oracle_case_embedding

TOLERANCE = 1e-5


def _expected(oracle, case) -> torch.Tensor:
    return oracle.embedding(oracle.process(oracle.chat_text(case.oracle_messages), case.images))


def _assert_close(got: list[float], expected: torch.Tensor) -> None:
    assert len(got) == expected.shape[0]
    assert (torch.tensor(got) - expected).abs().max().item() <= TOLERANCE


def test_text_image_and_image_text_embeddings_equal_transformers_last_hidden_state_normalized(make_llm, oracle):
    llm = make_llm()
    cases = [
        chat_case("A sentence about the sea."),
        chat_case(encode_image(make_image(84, 84, seed=11))),
        chat_case(encode_image(make_image(112, 84, seed=12)), "What is in this picture?"),
    ]
    results = llm.embed([c.prompt for c in cases])
    for case, result in zip(cases, results):
        _assert_close(result.embedding, _expected(oracle, case))
        assert abs(sum(v * v for v in result.embedding) - 1.0) < 1e-5
        assert result.usage.completion_tokens == 0


def test_a_prefix_hit_computes_only_the_rest_and_gives_the_same_embedding(make_llm, oracle):
    llm = make_llm()
    case = chat_case(encode_image(make_image(112, 112, seed=13)), "Describe the shapes in this picture, one by one, please.")
    [cold] = llm.embed([case.prompt])
    [hit] = llm.embed([case.prompt])
    assert cold.usage.cached_tokens == 0 and hit.usage.cached_tokens > 0
    _assert_close(hit.embedding, _expected(oracle, case))
    # A generation after the embedding reuses its KV too.
    [answer] = llm.generate([case.prompt], SamplingParams(max_tokens=2))
    assert answer.usage.cached_tokens > 0


def test_a_chunked_prompt_pools_its_last_chunk(make_llm, oracle):
    case = chat_case(encode_image(make_image(84, 84, seed=14)), "A question long enough to need a few chunks of prompt.")
    [result] = make_llm(max_num_batched_tokens=32).embed([case.prompt])
    _assert_close(result.embedding, _expected(oracle, case))


@pytest.mark.parametrize(("mode", "normalize"), [("pooling_mode_mean_tokens", True), ("pooling_mode_cls_token", False)])
def test_a_sentence_transformers_layout_sets_the_pooling(tiny_model, oracle, tmp_path, mode, normalize):
    path = tmp_path / "st"
    shutil.copytree(tiny_model.path, path)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    modules.append({"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"})
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64, mode: True}))
    case = chat_case(encode_image(make_image(84, 84, seed=15)), "Pool every row of this prompt.")
    llm = LLM(str(path))
    llm.generate([case.prompt], SamplingParams(max_tokens=1))  # a cached prefix, which pooling every row cannot use
    [result] = llm.embed([case.prompt])
    assert result.usage.cached_tokens == 0
    rows = oracle.hidden_states(oracle.process(oracle.chat_text(case.oracle_messages), case.images))
    expected = rows.mean(dim=0) if "mean" in mode else rows[0]
    _assert_close(result.embedding, torch.nn.functional.normalize(expected, dim=-1) if normalize else expected)


def test_a_video_embedding_equals_transformers(make_llm, oracle):
    case = chat_case(Video(make_clip(6, fps=2, width=64, height=48, seed=3)), "What happens here?")
    [result] = make_llm().embed([case.prompt])
    _assert_close(result.embedding, oracle_case_embedding(oracle, case))


def test_dimensions_are_refused_on_a_model_without_matryoshka(make_llm):
    with pytest.raises(RequestRejectedError, match="does not support Matryoshka"):
        make_llm().embed([chat_case("hello").prompt], dimensions=8)


def test_a_matryoshka_model_keeps_the_first_dimensions_then_normalizes(tiny_model, oracle, tmp_path):
    path = tmp_path / "matryoshka"
    shutil.copytree(tiny_model.path, path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "matryoshka_dimensions": [16, 32]}))
    case = chat_case(encode_image(make_image(84, 84, seed=16)), "Short, please.")
    llm = LLM(str(path))
    [result] = llm.embed([case.prompt], dimensions=16)
    row = oracle.hidden_states(oracle.process(oracle.chat_text(case.oracle_messages), case.images))[-1]
    _assert_close(result.embedding, torch.nn.functional.normalize(row[:16], dim=-1))
    with pytest.raises(RequestRejectedError, match=r"only supports Matryoshka dimensions \[16, 32\], got 8"):
        llm.embed([case.prompt], dimensions=8)
