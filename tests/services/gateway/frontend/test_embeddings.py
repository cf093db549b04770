"""/v1/embeddings and /v1/score requests to prompts, and their answers (pure logic,
services/gateway/frontend/embeddings.py); which APIs each runner serves (FrontendConfig.check_serves)."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from protos.gen import pb
from services.gateway.errors import GatewayError
from services.gateway.frontend.config import FrontendConfig
from services.gateway.frontend.embeddings import cosine, embed_all, embedding_prompts, encoded, score_prompts
from services.gateway.frontend.frontend import Frontend
from services.gateway.protocol.embeddings import EmbeddingRequest, ScoreRequest
from services.gateway.settings import Settings

IMAGE_PART = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def test_input_texts_and_token_ids_are_raw_prompts_one_each():
    assert [p.text for p in embedding_prompts(EmbeddingRequest(input="a sea"), None, 64)] == ["a sea"]
    assert [p.text for p in embedding_prompts(EmbeddingRequest(input=["a", "b"]), None, 64)] == ["a", "b"]
    [ids] = embedding_prompts(EmbeddingRequest(input=[1, 2, 3]), None, 64)
    assert list(ids.token_ids.ids) == [1, 2, 3]
    assert [list(p.token_ids.ids) for p in embedding_prompts(EmbeddingRequest(input=[[1], [2, 3]]), None, 64)] == [[1], [2, 3]]


def test_messages_render_without_a_generation_prompt_unless_asked():
    messages = [{"role": "user", "content": [IMAGE_PART, {"type": "text", "text": "what?"}]}]
    [prompt] = embedding_prompts(EmbeddingRequest.model_validate({"messages": messages}), None, 64)
    assert prompt.WhichOneof("prompt") == "chat" and json.loads(prompt.chat.chat_template_kwargs_json) == {"add_generation_prompt": False}
    [asked] = embedding_prompts(EmbeddingRequest.model_validate({"messages": messages, "add_generation_prompt": True}), None, 64)
    assert json.loads(asked.chat.chat_template_kwargs_json) == {"add_generation_prompt": True}


def test_truncation_keeps_the_last_tokens_and_minus_one_is_the_model_length():
    [prompt] = embedding_prompts(EmbeddingRequest(input="a b c", truncate_prompt_tokens=2), None, 64)
    assert (prompt.truncation.num_tokens, prompt.truncation.side) == (2, pb.Truncation.LEFT)
    [whole] = embedding_prompts(EmbeddingRequest(input="a b c", truncate_prompt_tokens=-1), None, 64)
    assert whole.truncation.num_tokens == 64


@pytest.mark.parametrize(
    "body",
    [
        {},  # neither input nor messages
        {"input": "a", "messages": [{"role": "user", "content": "b"}]},
        {"input": ""},
        {"input": "a", "encoding_format": "hex"},
        {"input": "a", "dimensions": 0},
        {"input": "a", "truncate_prompt_tokens": 0},
    ],
)
def test_malformed_embedding_requests_are_refused(body):
    with pytest.raises(ValidationError):
        EmbeddingRequest.model_validate(body)


def test_base64_is_float32_little_endian_and_float_is_the_values():
    vector = [0.5, -1.25, 3.0]
    assert encoded(vector, "float") == vector
    assert struct.unpack("<3f", base64.b64decode(encoded(vector, "base64"))) == (0.5, -1.25, 3.0)


def test_score_pairs_one_to_many_or_pairwise_and_content_goes_through_the_template():
    first, second = score_prompts(ScoreRequest.model_validate({"queries": "q", "documents": ["d", {"content": [IMAGE_PART]}]}), None, 64)
    assert [p.text for p in first] == ["q"] and second[0].text == "d" and second[1].WhichOneof("prompt") == "chat"
    old = ScoreRequest.model_validate({"text_1": ["a", "b"], "text_2": ["c", "d"]})
    assert [len(side) for side in old.sides()] == [2, 2]
    with pytest.raises(ValidationError, match="1:1, 1:N or N:N"):
        ScoreRequest.model_validate({"queries": ["a", "b"], "documents": ["c", "d", "e"]})
    with pytest.raises(ValidationError):
        ScoreRequest.model_validate({"queries": "a"})
    assert cosine([1.0, 0.0], [1.0, 1.0]) == pytest.approx(2**-0.5)


@pytest.mark.parametrize(
    ("runner", "served"),
    [
        ("generate", {"chat", "completions", "generate"}),
        ("pooling", {"embeddings", "score"}),
        ("both", {"chat", "completions", "generate", "embeddings", "score"}),
    ],
)
def test_each_runner_serves_its_apis_and_refuses_the_others_as_vllm(runner, served):
    config = FrontendConfig(served_names=("tiny",), runner=runner)
    frontend = Frontend(SimpleNamespace(config=config))
    for api in ("chat", "completions", "generate", "embeddings", "score"):
        if api in served:
            frontend.check_serves(api)
        else:
            with pytest.raises(GatewayError, match="The model does not support") as refused:
                frontend.check_serves(api)
            assert refused.value.status == 404
    assert ("decode" in config.routed_roles) == (runner != "pooling")


def test_the_runner_setting_is_checked_and_a_pooling_gateway_needs_no_decode_addresses():
    static = {"preprocess_address": "a:1", "encoder_address": "b:1", "prefill_address": "c:1"}
    Settings(runner="pooling", **static)
    with pytest.raises(ValueError, match="decode-address"):
        Settings(runner="both", **static)
    with pytest.raises(ValueError, match="runner must be one of"):
        Settings(runner="embed", index_url="redis://x")


def test_more_inputs_than_the_gateway_ever_admits_is_a_400_not_a_429():
    frontend = SimpleNamespace(config=FrontendConfig(served_names=("tiny",), max_num_requests=2))
    prompts = embedding_prompts(EmbeddingRequest(input=["a", "b", "c"]), None, 64)
    with pytest.raises(GatewayError, match="3 inputs in one request") as refused:
        asyncio.run(embed_all(frontend, prompts, dimensions=None, cache_salt=None))
    assert refused.value.status == 400
