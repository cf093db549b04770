"""Request validation and response shapes of the OpenAI-compatible API (pure logic): the pydantic
wire models, and how their errors become one OpenAI error naming the field."""

from __future__ import annotations

import json
import math

import pytest

from protos.gen import pb
from services.gateway.errors import GatewayError
from services.gateway.frontend.limits import RequestLimits
from services.gateway.frontend.openai_api import chat_body, to_chat_request, to_completion_request
from services.gateway.protocol.completion import CompletionRequest
from services.models.sampling_defaults import SamplingDefaults
from tests.factories import tool_call_history


def parse_chat_request(body: object, **options):
    """A raw JSON chat body to pipeline runs, as the Generate API's JSON form takes it."""
    return to_chat_request(chat_body(body, "test"), **options)


MESSAGES = [{"role": "user", "content": "hi"}]


def parse(**body):
    return parse_chat_request({"messages": MESSAGES, **body}, served_names=("tiny",), default_max_tokens=256)


def sampling(**body):
    [generation] = parse(**body).generations
    return generation.sampling


def test_defaults_and_field_mapping():
    request = parse(
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
    [generation] = request.generations
    assert generation.sampling.max_tokens == 7 and generation.sampling.temperature == 0 and generation.sampling.top_p == 0.5
    assert generation.sampling.seed == 3 and generation.sampling.stop == ("END",)
    assert request.stream and request.include_usage
    assert sampling().max_tokens == 256 and sampling().temperature == 1.0
    assert sampling(max_tokens=9).max_tokens == 9
    assert sampling(top_k=-1).top_k == 0  # vLLM's "disabled"


def test_only_a_defaulted_max_tokens_may_shrink_to_fit_the_context():
    assert parse().generations[0].fit_max_tokens
    assert not parse(max_tokens=9).generations[0].fit_max_tokens
    assert not parse(max_completion_tokens=9).generations[0].fit_max_tokens


def test_a_temperature_below_the_epsilon_is_greedy():
    assert sampling(temperature=1e-38).temperature == 0.0
    assert sampling(temperature=1e-6).is_greedy
    assert sampling(temperature=1e-3).temperature == 1e-3


def test_messages_reach_preprocess_without_defaults_added():
    parts = [{"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": "data:x"}, "uuid": "cat-1"}]
    request = parse_chat_request({"messages": [{"role": "user", "content": parts}]}, served_names=("tiny",), default_max_tokens=1)
    user = pb.ChatMessage(
        role=pb.ChatMessage.USER,
        parts=pb.ContentParts(parts=[pb.ContentPart(text="what is it?"), pb.ContentPart(image=pb.ImageInput(url="data:x", uuid="cat-1"))]),
    )
    assert request.generations[0].prompt == pb.PromptInput(chat=pb.ChatPrompt(messages=[user]))


def test_n_choices_are_numbered_and_seeded_apart():
    generations = parse(n=3, seed=2**63 - 2).generations
    assert [g.index for g in generations] == [0, 1, 2] and {g.prompt_index for g in generations} == {0}
    assert [g.sampling.seed for g in generations] == [2**63 - 2, 2**63 - 1, -(2**63)]  # wraps within int64
    assert [g.sampling.seed for g in parse(n=2).generations] == [None, None]


def completion_request(**body):
    return to_completion_request(CompletionRequest.model_validate(body), served_names=("tiny",))


def test_completion_prompts_become_prompt_inputs_numbered_prompt_major():
    batch = completion_request(prompt=["a", "b"], n=2, max_tokens=5)
    assert [(g.index, g.prompt_index, g.prompt.text) for g in batch.generations] == [
        (0, 0, "a"),
        (1, 0, "a"),
        (2, 1, "b"),
        (3, 1, "b"),
    ]
    assert batch.generations[0].sampling.max_tokens == 5
    [tokens] = completion_request(prompt=[5, 6, 7]).generations
    assert tokens.prompt == pb.PromptInput(token_ids=pb.TokenIds(ids=[5, 6, 7])) and tokens.sampling.max_tokens == 16
    assert len(completion_request(prompt=[[5], [6, 7]]).generations) == 2
    [image] = completion_request(
        prompt="<|vision_start|><|image_pad|><|vision_end|>What?",
        multi_modal_data={"image": [{"url": "data:image/png;base64,AAAA", "uuid": "cat"}, "data:x"]},
    ).generations
    assert list(image.prompt.images) == [pb.ImageInput(url="data:image/png;base64,AAAA", uuid="cat"), pb.ImageInput(url="data:x")]


@pytest.mark.parametrize(
    "body,param,text",
    [
        ({"prompt": "a", "max_tokens": 0}, None, "max_tokens 0 needs echo=true"),
        ({"prompt": "a", "logprobs": -2}, "logprobs", "greater than or equal to -1"),
        ({"prompt": ["a", "b"], "multi_modal_data": {"image": "data:x"}}, None, "single prompt"),
        ({"prompt": [-1]}, None, "greater than or equal to 0"),
        ({"prompt": ""}, None, "Either prompt or prompt_embeds must be provided and non-empty"),
        ({"prompt": None}, None, "Either prompt or prompt_embeds must be provided and non-empty"),
        ({}, None, "Either prompt or prompt_embeds must be provided and non-empty"),
    ],
)
def test_invalid_completion_requests(body, param, text):
    from pydantic import ValidationError

    from services.gateway.protocol.validation_errors import validation_error

    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate(body)
    error = validation_error(info.value.errors())
    assert text in error.message, error.message
    if param is not None:
        assert error.param == param


@pytest.mark.parametrize(
    "body,status,param,text",
    [
        ({"model": "gpt-4"}, 404, "model", "does not exist"),
        ({"n": 17}, 400, "n", "less than or equal to 16"),
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
        ({"logit_bias": {"a": 1.0}}, 400, "logit_bias", "token ids"),
        ({"logit_bias": {"bad1": 1.0, "5": 1.0, "bad2": 2.0}}, 400, "logit_bias", "got 'bad1', 'bad2'"),
        ({"presence_penalty": 2.5}, 400, "presence_penalty", "less than or equal to 2"),
        ({"repetition_penalty": 0.0}, 400, "repetition_penalty", "greater than 0"),
        ({"min_p": -0.1}, 400, "min_p", "greater than or equal to 0"),
        ({"min_tokens": 9, "max_tokens": 4}, 400, None, "min_tokens must be in [0, max_tokens=4]"),
        ({"response_format": {"type": "json_schema"}}, 400, "response_format", "needs json_schema.schema"),
        ({"guided_regex": "a+", "guided_choice": ["a"]}, 400, "guided_choice", "not guided_regex, guided_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, 400, None, "needs a tool-call parser"),
        ({"tool_choice": "required"}, 400, "tool_choice", "tool_choice: needs tools"),
        (
            {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}},
            400,
            "tool_choice",
            "names 'g', which is not among the tools ['f']",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required", "guided_regex": "a"},
            400,
            None,
            "constrains the output already",
        ),
        ({"messages": [{"role": "tool"}]}, 400, "messages[0]", "a tool message needs content"),
        ({"stream_options": "yes"}, 400, "stream_options", "dictionary"),
        ({"messages": []}, 400, "messages", "at least 1"),
        ({"messages": [{"role": "bot", "content": "x"}]}, 400, "messages[0].role", "'developer', 'user', 'assistant' or 'tool'"),
        (
            {"messages": [{"role": "user", "content": [{"type": "video"}]}]},
            400,
            "messages[0].content[0]",
            "unsupported content part type 'video'",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": ""}}]}]}, 400, None, "at least 1"),
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
        parse_chat_request({}, served_names=("tiny",), default_max_tokens=1)
    with pytest.raises(GatewayError, match="JSON object"):
        parse_chat_request([1], served_names=("tiny",), default_max_tokens=1)


def test_logprobs_flags_map_to_the_number_of_alternatives():
    assert sampling().logprobs is None
    assert sampling(logprobs=True).logprobs == 0
    assert sampling(logprobs=True, top_logprobs=5).logprobs == 5
    with pytest.raises(GatewayError, match="top_logprobs needs logprobs=true"):
        parse(top_logprobs=2)
    [generation] = completion_request(prompt="a", logprobs=3).generations
    assert generation.sampling.logprobs == 3 and generation.sampling.prompt_logprobs is None


def test_prompt_logprobs_are_asked_for_or_implied_by_echo_as_vllm_does():
    assert sampling(prompt_logprobs=2).prompt_logprobs == 2
    assert sampling(logprobs=True, top_logprobs=1, echo=True).prompt_logprobs == 1  # chat: echo takes top_logprobs
    assert sampling(logprobs=True, echo=True).prompt_logprobs is None  # ... only when given
    [echoed] = completion_request(prompt="a", logprobs=2, echo=True).generations
    assert (echoed.sampling.prompt_logprobs, echoed.sampling.logprobs) == (2, 2)
    [scored] = completion_request(prompt="a", logprobs=0, echo=True, max_tokens=0).generations
    assert scored.sampling.max_tokens == 1 and scored.sampling.prompt_logprobs == 0  # one step scores the prompt


def test_named_token_ids_reach_the_sampling_with_vllms_rules():
    params = sampling(logprobs=True, allowed_token_ids=[5, 9], logprob_token_ids=[100, 7])
    assert (params.allowed_token_ids, params.logprob_token_ids, params.logprobs) == ((5, 9), (100, 7), 0)
    assert sampling(logprob_token_ids=[], allowed_token_ids=None).logprob_token_ids is None  # empty asks for nothing
    assert parse(logprobs=True, return_tokens_as_token_ids=True).tokens_as_ids
    [generation] = completion_request(prompt="a", logprobs=5, logprob_token_ids=[3]).generations
    assert generation.sampling.logprob_token_ids == (3,)
    for body, text in (
        ({"allowed_token_ids": []}, "allowed_token_ids is empty"),
        ({"logprob_token_ids": [3]}, "`logprobs` must be set"),
        ({"logprobs": True, "logprob_token_ids": list(range(129))}, "at most 128"),
        ({"logprobs": True, "allowed_token_ids": [-1]}, "greater than or equal to 0"),
    ):
        with pytest.raises(GatewayError, match=text):
            parse(**body)
    with pytest.raises(ValueError, match="no output tokens are generated"):
        completion_request(prompt="a", echo=True, max_tokens=0, logprobs=1, logprob_token_ids=[3])


def test_unknown_fields_are_ignored_and_named():
    from services.gateway.frontend.openai_api import pop_ignored_fields
    from services.gateway.protocol.chat import ChatCompletionRequest

    request = ChatCompletionRequest.model_validate(
        {
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a", "uuid": "x"}], "reasoning_content": "r"}],
            "store": True,
            "metadata": {"k": "v"},
            "service_tier": "auto",
        }
    )
    assert pop_ignored_fields(request) == [
        "store",
        "metadata",
        "service_tier",
        "messages[0].reasoning_content",
        "messages[0].content[0].uuid",
    ]
    assert pop_ignored_fields(request) == []  # taken out: nothing downstream sees them
    assert "store" not in request.model_dump() and "reasoning_content" not in request.messages[0].model_dump()


def test_what_common_clients_send_is_accepted():
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    history = tool_call_history("c1")
    request = parse_chat_request(
        {
            "messages": history,
            "tools": tools,
            "tool_choice": "none",
            "response_format": {"type": "text"},
            "max_tokens": None,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "chat_template_kwargs": {"enable_thinking": False},
            "messages_extra": 1,
        },
        served_names=("tiny",),
        default_max_tokens=256,
    )
    [generation] = request.generations
    chat = generation.prompt.chat
    assert [tool.name for tool in chat.tools] == ["get_weather"] and json.loads(chat.chat_template_kwargs_json) == {
        "enable_thinking": False
    }
    assert chat.messages[2].tool_calls[0].name == "get_weather" and chat.messages[3].tool_call_id == "c1"
    assert request.continuous_usage and request.include_usage


def test_sampling_controls_reach_the_engine_with_vllms_clipping():
    params = sampling(
        presence_penalty=0.5, frequency_penalty=-0.5, repetition_penalty=1.2, min_p=0.1, min_tokens=3, logit_bias={"7": 250, "3": -1}
    )
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.5, -0.5, 1.2)
    assert params.min_p == 0.1 and params.min_tokens == 3 and params.logit_bias == ((3, -1.0), (7, 100.0))
    assert params.reads_logits and not sampling(temperature=0).reads_logits


def test_every_spelling_of_structured_output_becomes_one_constraint():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    cases = [
        ({"response_format": {"type": "json_object"}}, ("json", '{"type": "object"}', False)),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}, ("json", json.dumps(schema), False)),
        ({"structured_outputs": {"json": schema, "disable_any_whitespace": True}}, ("json", json.dumps(schema), True)),
        ({"structured_outputs": {"regex": "[a-z]+"}}, ("regex", "[a-z]+", False)),
        ({"structured_outputs": {"choice": ["x", "y"]}}, ("choice", '["x", "y"]', False)),
        ({"guided_json": json.dumps(schema)}, ("json", json.dumps(schema), False)),
        ({"guided_grammar": 'start: "a"'}, ("grammar", 'start: "a"', False)),
        ({"response_format": {"type": "text"}}, None),
    ]
    for body, expected in cases:
        structured = sampling(**body).structured
        got = None if structured is None else (structured.kind, structured.spec, structured.compact_whitespace)
        assert got == expected, body


def test_forced_tool_choices_constrain_the_output():
    tools = [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}},
        {"type": "function", "function": {"name": "g"}},
    ]
    named = parse(tools=tools, tool_choice={"type": "function", "function": {"name": "f"}})
    assert json.loads(named.generations[0].sampling.structured.spec) == tools[0]["function"]["parameters"]
    assert named.tool_mode.kind == "named" and named.tool_mode.function == "f"
    required = json.loads(parse(tools=tools, tool_choice="required").generations[0].sampling.structured.spec)
    assert required["type"] == "array" and [item["properties"]["name"]["const"] for item in required["items"]["anyOf"]] == ["f", "g"]
    auto = parse_chat_request({"messages": MESSAGES, "tools": tools}, served_names=("tiny",), default_max_tokens=8, tool_parser="hermes")
    assert auto.tool_mode.kind == "auto" and auto.generations[0].sampling.structured is None


QWEN2_VL_7B_DEFAULTS = SamplingDefaults(repetition_penalty=1.05, temperature=0.1, top_k=1, top_p=0.001)


def test_the_checkpoints_sampling_defaults_fill_only_the_fields_a_request_leaves_unset():
    def with_defaults(**body):
        request = {"messages": MESSAGES, **body}
        [generation] = parse_chat_request(
            request, served_names=("tiny",), default_max_tokens=8, sampling_defaults=QWEN2_VL_7B_DEFAULTS
        ).generations
        return generation.sampling

    unset = with_defaults()
    assert (unset.repetition_penalty, unset.temperature, unset.top_k, unset.top_p, unset.min_p) == (1.05, 0.1, 1, 0.001, 0.0)
    greedy = with_defaults(temperature=0, repetition_penalty=1.0)  # what the request sends wins, 0 included
    assert (greedy.temperature, greedy.repetition_penalty, greedy.top_k) == (0.0, 1.0, 1)
    completion = to_completion_request(
        CompletionRequest.model_validate({"prompt": "hi", "top_p": 0.9}), served_names=("tiny",), sampling_defaults=QWEN2_VL_7B_DEFAULTS
    )
    [generation] = completion.generations
    assert (generation.sampling.top_p, generation.sampling.repetition_penalty) == (0.9, 1.05)
    assert sampling() == parse_chat_request({"messages": MESSAGES}, served_names=("tiny",), default_max_tokens=256).generations[0].sampling


def test_stop_token_ids_reach_the_sampling_on_both_endpoints():
    assert sampling(stop_token_ids=[7, 5]).stop_token_ids == (7, 5) and sampling().stop_token_ids == ()
    [generation] = completion_request(prompt="a", stop_token_ids=[9]).generations
    assert generation.sampling.stop_token_ids == (9,)
    with pytest.raises(GatewayError, match="stop_token_ids"):
        parse(stop_token_ids=[-1])


def test_logprobs_past_the_cap_are_refused_in_vllms_words_as_the_request_becomes_sampling():
    with pytest.raises(GatewayError, match="Requested sample logprobs of 21, which is greater than max allowed: 20"):
        completion_request(prompt="a", logprobs=21)
    with pytest.raises(GatewayError, match="the whole vocabulary"):
        parse(logprobs=True, top_logprobs=-1)  # no vocabulary size known: -1 cannot be served


def test_truncation_reaches_every_prompt_and_minus_one_is_the_model_length_less_one():
    [generation] = parse(truncate_prompt_tokens=5, truncation_side="right").generations
    assert (generation.prompt.truncation.num_tokens, generation.prompt.truncation.side) == (5, pb.Truncation.RIGHT)
    request = to_completion_request(
        CompletionRequest.model_validate({"prompt": ["a", "b"], "truncate_prompt_tokens": -1}),
        served_names=("tiny",),
        limits=RequestLimits(max_model_len=64),
    )
    assert [(g.prompt.truncation.num_tokens, g.prompt.truncation.side) for g in request.generations] == [(63, pb.Truncation.TOKENIZER)] * 2
    assert not parse().generations[0].prompt.HasField("truncation")
    with pytest.raises(GatewayError, match="at least 1"):
        parse(truncate_prompt_tokens=0)
    with pytest.raises(GatewayError, match="truncation_side"):
        parse(truncate_prompt_tokens=3, truncation_side="middle")
