"""/v1/chat/completions/batch: each conversation checked and run as a chat request of its own."""

from __future__ import annotations

import pytest

from services.gateway.errors import GatewayError
from services.gateway.frontend.batch_chat import to_batch_chat_request
from services.gateway.protocol.batch_chat import BatchChatCompletionRequest


def batch(**body):
    request = BatchChatCompletionRequest.model_validate({"model": "tiny", **body})
    return to_batch_chat_request(request, served_names=("tiny",), default_max_tokens=32, tenant=None)


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_choice_i_answers_conversation_i_with_the_shared_fields():
    conversations = [user("alpha"), [*user("beta"), {"role": "assistant", "content": "Sure: "}]]
    request, echoes, ignored = batch(
        messages=conversations,
        temperature=0,
        max_tokens=5,
        echo=True,
        add_generation_prompt=False,
        continue_final_message=True,
        logprobs=True,
        return_tokens_as_token_ids=True,
        metadata={"x": 1},
    )
    assert [(g.index, g.prompt_index) for g in request.generations] == [(0, 0), (1, 1)]
    assert all(g.sampling.max_tokens == 5 and g.sampling.logprobs == 0 for g in request.generations)
    assert request.generations[0].prompt != request.generations[1].prompt
    assert echoes == ["", "Sure: "] and request.tokens_as_ids and not request.stream
    assert ignored == ["metadata"]


@pytest.mark.parametrize(
    ("body", "text"),
    [
        ({"stream": True}, "`stream`"),
        ({"n": 2}, "`n`"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "`tools`"),
        ({"kv_transfer_params": {"prompt_token_ids": [1, 2]}}, "`kv_transfer_params`"),
        ({"use_beam_search": True}, "use_beam_search"),
        ({"temperature": "hot"}, "conversation 0: temperature"),
    ],
)
def test_what_the_batch_endpoint_refuses_is_a_400_naming_it(body, text):
    with pytest.raises(GatewayError, match=text) as raised:
        batch(messages=[user("a"), user("b")], **body)
    assert raised.value.status == 400


def test_a_bad_message_names_its_conversation_and_an_empty_batch_is_refused():
    with pytest.raises(GatewayError, match=r"messages\[1\]\[0\]: a user message needs content"):
        batch(messages=[user("a"), [{"role": "user"}]])
    for messages in ([], [[]]):
        with pytest.raises(ValueError):
            batch(messages=messages)
