"""Request validation and response shapes of the OpenAI-compatible API (pure logic): the pydantic
wire models, and how their errors become one OpenAI error naming the field."""

from __future__ import annotations

import math

import pytest

from services.gateway.errors import GatewayError
from services.gateway.openai_api import chunk, completion, parse_chat_request, usage
from services.gateway.protocol import ChunkDelta

MESSAGES = [{"role": "user", "content": "hi"}]


def parse(**body):
    return parse_chat_request({"messages": MESSAGES, **body}, served_model="tiny", default_max_tokens=256)


def test_defaults_and_field_mapping():
    chat = parse(
        model="tiny",
        temperature=0,
        top_p=0.5,
        seed=3,
        stop="END",
        max_completion_tokens=7,
        stream=True,
        stream_options={"include_usage": True},
        user="u1",
    )
    assert chat.sampling.max_tokens == 7 and chat.sampling.temperature == 0 and chat.sampling.top_p == 0.5
    assert chat.sampling.seed == 3 and chat.sampling.stop == ("END",)
    assert chat.stream and chat.include_usage
    assert parse().sampling.max_tokens == 256 and parse().sampling.temperature == 1.0
    assert parse(max_tokens=9).sampling.max_tokens == 9
    assert parse(top_k=-1).sampling.top_k == 0  # vLLM's "disabled"


def test_a_temperature_below_the_epsilon_is_greedy():
    assert parse(temperature=1e-38).sampling.temperature == 0.0
    assert parse(temperature=1e-6).sampling.is_greedy
    assert parse(temperature=1e-3).sampling.temperature == 1e-3


def test_messages_reach_preprocess_without_defaults_added():
    parts = [{"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": "data:x"}, "uuid": "cat-1"}]
    chat = parse_chat_request({"messages": [{"role": "user", "content": parts}]}, served_model="tiny", default_max_tokens=1)
    assert chat.preprocess_body == {"messages": [{"role": "user", "content": parts}]}


@pytest.mark.parametrize(
    "body,status,param,text",
    [
        ({"model": "gpt-4"}, 404, "model", "does not exist"),
        ({"n": 2}, 400, "n", "only n=1"),
        ({"temperature": "hot"}, 400, "temperature", "valid number"),
        ({"temperature": math.nan}, 400, "temperature", "finite"),
        ({"temperature": math.inf}, 400, "temperature", "finite"),
        ({"temperature": 3}, 400, "temperature", "less than or equal to 2"),
        ({"max_tokens": 0}, 400, "max_tokens", "greater than or equal to 1"),
        ({"max_tokens": 2**31}, 400, "max_tokens", "less than or equal to 2147483647"),
        ({"max_tokens": 1.5}, 400, "max_tokens", "integer"),
        ({"seed": 2**64}, 400, "seed", "less than or equal"),
        ({"stream": "yes"}, 400, "stream", "boolean"),
        ({"stop": [1]}, 400, "stop[0]", "string"),
        ({"stop": ["a"] * 5}, 400, "stop", "at most 4"),
        ({"logit_bias": {}}, 400, "logit_bias", "unsupported field"),
        ({"presence_penalty": 1.0}, 400, "presence_penalty", "not supported"),
        ({"stream_options": "yes"}, 400, "stream_options", "dictionary"),
        ({"messages": []}, 400, "messages", "at least 1"),
        ({"messages": [{"role": "bot", "content": "x"}]}, 400, "messages[0].role", "'system', 'user' or 'assistant'"),
        (
            {"messages": [{"role": "user", "content": [{"type": "video"}]}]},
            400,
            "messages[0].content[0]",
            "unsupported content part type 'video'",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": ""}}]}]}, 400, None, "at least 1"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "uuid": "x"}]}]}, 400, None, "unsupported"),
    ],
)
def test_invalid_requests_get_a_clear_4xx_naming_the_field(body, status, param, text):
    with pytest.raises(GatewayError) as info:
        parse(**body)
    assert info.value.status == status and text in info.value.message, info.value.message
    if param is not None:
        assert info.value.param == param and info.value.message.startswith(f"{param}: " if status == 400 else "")
    assert info.value.to_json()["error"]["message"] == info.value.message


def test_missing_messages_and_non_object_body():
    with pytest.raises(GatewayError, match="messages: Field required"):
        parse_chat_request({}, served_model="tiny", default_max_tokens=1)
    with pytest.raises(GatewayError, match="JSON object"):
        parse_chat_request([1], served_model="tiny", default_max_tokens=1)


def test_response_shapes():
    counts = usage(10, 5, 4)
    assert counts.model_dump() == {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    body = completion("id1", "tiny", "hello", "stop", counts).model_dump()
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hello"} and body["object"] == "chat.completion"
    piece = chunk("id1", "tiny", delta=ChunkDelta(content="he")).model_dump()
    assert piece["choices"][0]["delta"]["content"] == "he" and piece["object"] == "chat.completion.chunk"
    assert chunk("id1", "tiny", delta=None, usage=counts).choices == []
