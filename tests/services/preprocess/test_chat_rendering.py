"""Chat messages through the model's chat template: the roles and fields common clients send,
tools and template variables, and a template's refusal as the request's 400."""

from __future__ import annotations

import pytest

from services.gateway.error_kinds import KIND_RULES
from services.gateway.frontend.prompt_wire import prompt_for_library
from services.preprocess import errors as E
from services.preprocess.config import PreprocessConfig
from services.preprocess.preprocessor import Preprocessor

# Prints what the request contributed, so each field's arrival is visible in the prompt text.
PROBE_TEMPLATE = (
    "{% for m in messages %}[{{ m.role }}{% if m.name %}:{{ m.name }}{% endif %}]{{ m.content }}"
    "{% for call in m.tool_calls or [] %}<call {{ call.function.name }}>{% endfor %}"
    "{% if m.tool_call_id %}<answers {{ m.tool_call_id }}>{% endif %}{% endfor %}"
    "{% for tool in tools or [] %}<tool {{ tool.function.name }}>{% endfor %}"
    "{% if enable_thinking is defined %}<thinking {{ enable_thinking }}>{% endif %}"
    "{% if messages[0].content == 'refuse me' %}{{ raise_exception('roles must alternate') }}{% endif %}"
)


@pytest.fixture(scope="module")
def preprocessor(tiny_model):
    return Preprocessor(tiny_model, PreprocessConfig())


@pytest.fixture
def probe(preprocessor):
    real = preprocessor.chat_template
    preprocessor.chat_template = PROBE_TEMPLATE
    yield preprocessor
    preprocessor.chat_template = real


def render(preprocessor, **body) -> str:
    return preprocessor.tokenizer.decode(preprocessor.preprocess(prompt_for_library(body)).prompt_token_ids)


def test_developer_renders_as_system_with_the_real_template(preprocessor):
    as_system = render(preprocessor, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    as_developer = render(preprocessor, messages=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert as_developer == as_system and "Be brief." in as_system


def test_tool_history_names_tools_and_template_variables_reach_the_template(probe):
    messages = [
        {"role": "user", "content": "Weather?", "name": "ann"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "wx", "arguments": "{}"}}],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
    ]
    tools = [{"type": "function", "function": {"name": "wx"}}]
    text = render(probe, messages=messages, tools=tools, chat_template_kwargs={"enable_thinking": False})
    assert text == "[user:ann]Weather?[assistant]<call wx>[tool]sunny<answers c1><tool wx><thinking False>"


def test_template_kwargs_set_the_generation_prompt_as_vllm_resolves_them(preprocessor):
    messages = [{"role": "user", "content": "Hi"}]
    default = render(preprocessor, messages=messages)
    assert render(preprocessor, messages=messages, chat_template_kwargs={"add_generation_prompt": True}) == default
    without = render(preprocessor, messages=messages, chat_template_kwargs={"add_generation_prompt": False})
    assert default.startswith(without) and default[len(without) :] == "<|im_start|>assistant\n"


def test_continue_final_message_leaves_the_assistants_turn_open(preprocessor):
    messages = [{"role": "user", "content": "Count to three."}, {"role": "assistant", "content": "One, two,"}]
    text = render(preprocessor, messages=messages, chat_template_kwargs={"add_generation_prompt": False, "continue_final_message": True})
    assert text.endswith("<|im_start|>assistant\nOne, two,")
    with pytest.raises(E.InvalidRequestError, match="cannot both be true"):
        preprocessor.preprocess(prompt_for_library({"messages": messages, "chat_template_kwargs": {"continue_final_message": True}}))


@pytest.mark.parametrize(
    "body,message",
    [
        ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"tokenize": True}}, "only set template variables"),
        ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"add_generation_prompt": "yes"}}, "true or false"),
        ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"messages": []}}, "may not set messages"),
    ],
)
def test_bad_template_inputs_are_the_requests_fault(probe, body, message):
    with pytest.raises(E.InvalidRequestError, match=message):
        probe.preprocess(prompt_for_library(body))


def test_a_template_that_refuses_the_conversation_is_a_400(probe):
    with pytest.raises(E.InvalidRequestError, match="cannot render these messages: roles must alternate") as info:
        probe.preprocess(prompt_for_library({"messages": [{"role": "user", "content": "refuse me"}]}))
    assert KIND_RULES[info.value.kind].status == 400


def test_detokenize_round_trips_and_refuses_ids_outside_the_vocabulary(preprocessor):
    ids = preprocessor.tokenizer.encode("hello world")
    assert preprocessor.detokenize(ids) == "hello world"
    with pytest.raises(E.InvalidRequestError, match="outside the vocabulary"):
        preprocessor.detokenize([preprocessor.vocab_size])
