"""Request validation and response shapes of the OpenAI-compatible API (pure logic)."""

from __future__ import annotations

import pytest

from services.gateway.errors import GatewayError
from services.gateway.openai_api import chunk_json, completion_json, parse_chat_request, usage_json

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
    )
    assert chat.sampling.max_tokens == 7 and chat.sampling.temperature == 0 and chat.sampling.top_p == 0.5
    assert chat.sampling.seed == 3 and chat.sampling.stop == ("END",)
    assert chat.stream and chat.include_usage
    assert parse().sampling.max_tokens == 256 and parse().sampling.temperature == 1.0
    assert parse(max_tokens=9).sampling.max_tokens == 9


@pytest.mark.parametrize(
    "body,status,text",
    [
        ({"model": "gpt-4"}, 404, "does not exist"),
        ({"n": 2}, 400, "n=1"),
        ({"temperature": "hot"}, 400, "must be a number"),
        ({"temperature": 3}, 400, "between 0 and 2"),
        ({"max_tokens": 0}, 400, "max_tokens"),
        ({"max_tokens": 1.5}, 400, "integer"),
        ({"stop": [1]}, 400, "stop"),
        ({"logit_bias": {}}, 400, "unsupported field"),
        ({"presence_penalty": 1.0}, 400, "not supported"),
        ({"stream_options": "yes"}, 400, "stream_options"),
    ],
)
def test_invalid_requests_get_clear_4xx(body, status, text):
    with pytest.raises(GatewayError) as info:
        parse(**body)
    assert info.value.status == status and text in info.value.message
    assert info.value.to_json()["error"]["message"] == info.value.message


def test_missing_messages_and_non_object_body():
    with pytest.raises(GatewayError, match="'messages' is required"):
        parse_chat_request({}, served_model="tiny", default_max_tokens=1)
    with pytest.raises(GatewayError, match="JSON object"):
        parse_chat_request([1], served_model="tiny", default_max_tokens=1)


def test_response_shapes():
    usage = usage_json(10, 5, 4)
    assert usage == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "prompt_tokens_details": {"cached_tokens": 4}}
    body = completion_json("id1", "tiny", "hello", "stop", usage)
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hello"} and body["object"] == "chat.completion"
    chunk = chunk_json("id1", "tiny", delta={"content": "he"})
    assert chunk["choices"][0]["delta"] == {"content": "he"} and chunk["object"] == "chat.completion.chunk"
    assert chunk_json("id1", "tiny", delta={}, usage=usage, choices=False)["choices"] == []
