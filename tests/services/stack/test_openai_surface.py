"""What common clients send, through the official openai client on the session's real stack:
the roles and fields vLLM accepts, unknown fields ignored and named, the sampling controls
applied on the engine (penalties against transformers, logit_bias, min_tokens), usage on every
chunk, structured outputs and forced tool calls that validate, and /tokenize, /detokenize,
/version and /v1/models."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import torch

from services.engine.config import EngineConfig
from services.engine.llm import LLM
from services.engine.sampling_params import SamplingParams
from tests.factories import chat_case, tool_call_history
from tests.oracle import OracleInputs
from tests.services.stack.e2e_helpers import GREEDY, client_for, png

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]


def root_url(stack) -> str:
    return stack.base_url.removesuffix("/v1")


def greedy_chat(stack, messages, **extra):
    return client_for(stack).chat.completions.create(**{"model": "tiny", "messages": messages, "temperature": 0, "max_tokens": 12, **extra})


def test_what_common_clients_send_is_served_and_unknown_fields_are_named(stack):
    history = [
        *tool_call_history("call_1"),
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": _data_url(png(64, 48, 3)), "detail": "low"}}]},
    ]
    raw = client_for(stack).chat.completions.with_raw_response.create(
        model="tiny",
        messages=history,
        tools=TOOLS,
        tool_choice="none",
        response_format={"type": "text"},
        max_tokens=None,
        store=False,
        metadata={"team": "search"},
        service_tier="auto",
        parallel_tool_calls=False,
        temperature=0,
        extra_body={"max_tokens": 8, "ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}, "guided_fancy": 1},
    )
    reply = raw.parse()
    assert reply.choices[0].message.content and reply.usage.completion_tokens == 8
    assert set(raw.headers["tessera-ignored-fields"].split(", ")) == {"store", "metadata", "service_tier", "guided_fancy"}


def test_developer_is_system_and_a_tool_choice_naming_no_tool_says_why(stack):
    ask = {"role": "user", "content": "Hello"}
    as_system = greedy_chat(stack, [{"role": "system", "content": "Be terse."}, ask], **_ignore_eos())
    as_developer = greedy_chat(stack, [{"role": "developer", "content": "Be terse."}, ask], **_ignore_eos())
    assert as_developer.choices[0].message.content == as_system.choices[0].message.content
    body = {"messages": [ask], "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "book_flight"}}}
    response = httpx.post(stack.base_url + "/chat/completions", json=body, timeout=30)
    assert response.status_code == 400 and "names 'book_flight', which is not among the tools" in response.json()["error"]["message"]
    auto = greedy_chat(stack, [ask], tools=TOOLS, **_ignore_eos())  # the Qwen family parses auto tool calls
    assert auto.choices[0].message.content and auto.choices[0].message.tool_calls == []


def test_repetition_penalty_equals_transformers(stack, oracle):
    """Below 1 the "penalty" favours seen tokens: the built-in model's random weights never
    repeat a token on their own, so only that direction changes its output."""
    case = chat_case("Count: one, two, one, two, one, two,")
    inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images)
    plain = oracle.generate(inputs, 12).token_ids
    penalised = oracle.generate(inputs, 12, repetition_penalty=0.5).token_ids
    assert penalised != plain  # the penalty matters on this prompt
    reply = greedy_chat(stack, case.body["messages"], extra_body={"repetition_penalty": 0.5, "ignore_eos": True})
    assert reply.choices[0].message.content == oracle.tokenizer.decode(penalised, skip_special_tokens=True)


def test_presence_and_frequency_penalties_change_greedy_output_deterministically(stack):
    """Negative penalties favour the tokens already out (the arithmetic itself is checked
    against vLLM's definition in tests/services/engine/test_logits_processors.py)."""
    messages = chat_case("Say the same word again and again:").body["messages"]
    plain = greedy_chat(stack, messages, **_ignore_eos()).choices[0].message.content
    penalised = [
        greedy_chat(stack, messages, frequency_penalty=-2.0, presence_penalty=-2.0, **_ignore_eos()).choices[0].message.content
        for _ in range(2)
    ]
    assert penalised[0] == penalised[1] != plain


def test_a_seeded_sampled_request_draws_as_one_engine_would(stack, tiny_model):
    """The prefill node samples the first token and the decode node the rest, each through its
    screened head: a seeded request's tokens equal those of one in-process engine sampling them
    all, since a draw depends only on the seed and the token's position."""
    case = chat_case("Tell me a story about a river.")
    sampling = {"temperature": 0.9, "seed": 11, "max_tokens": 10}
    replies = [
        client_for(stack).chat.completions.create(model="tiny", messages=case.body["messages"], **sampling, extra_body={"ignore_eos": True})
        for _ in range(2)
    ]
    [local] = LLM(str(tiny_model.path), EngineConfig()).generate([case.prompt], SamplingParams(**sampling, ignore_eos=True))
    greedy = greedy_chat(stack, case.body["messages"], max_tokens=10, extra_body={"ignore_eos": True})
    assert replies[0].choices[0].message.content == replies[1].choices[0].message.content == local.text
    assert local.text != greedy.choices[0].message.content


def test_logit_bias_forces_a_token_and_min_tokens_holds_off_the_stop(stack):
    forced = _tokenize(stack, {"prompt": " blue"})["tokens"][-1]
    reply = greedy_chat(stack, [{"role": "user", "content": "Name a colour."}], logit_bias={str(forced): 100}, max_tokens=5)
    detokenized = httpx.post(root_url(stack) + "/detokenize", json={"tokens": [forced] * 5}, timeout=30).json()["prompt"]
    assert reply.choices[0].message.content == detokenized and reply.usage.completion_tokens == 5
    # The first token stops the plain request (a stop string of its text); min_tokens holds it off.
    first = greedy_chat(stack, [{"role": "user", "content": "Hi"}], max_tokens=1, **_ignore_eos()).choices[0].message.content
    stop = first.strip() or first
    stopped = greedy_chat(stack, [{"role": "user", "content": "Hi"}], stop=[stop], **_ignore_eos())
    held = greedy_chat(stack, [{"role": "user", "content": "Hi"}], stop=[stop], extra_body={"min_tokens": 6, "ignore_eos": True})
    assert stopped.usage.completion_tokens <= 1 and held.usage.completion_tokens >= 6


def test_every_streamed_chunk_carries_usage_so_far(stack):
    chunks = list(
        client_for(stack).chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Tell me a story."}],
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            **GREEDY,
        )
    )
    counts = [c.usage.completion_tokens for c in chunks if c.choices and c.choices[0].delta.content]
    assert counts and counts == sorted(counts) and chunks[-1].usage.completion_tokens == 12


def test_tokenize_counts_what_the_model_sees_and_detokenize_inverts_it(stack):
    case = chat_case(png(80, 60, 4), "What is this?")
    reply = greedy_chat(stack, case.body["messages"], max_tokens=1)
    counted = _tokenize(stack, {"model": "tiny", "messages": case.body["messages"]})
    assert counted["count"] == reply.usage.prompt_tokens == len(counted["tokens"]) and counted["max_model_len"] > counted["count"]
    # As vLLM: without the generation prompt (the top-level field, or chat_template_kwargs'), fewer.
    bare = _tokenize(stack, {"messages": case.body["messages"], "add_generation_prompt": False})
    assert bare["tokens"] == counted["tokens"][: bare["count"]] and bare["count"] < counted["count"]
    kwargs = {"messages": case.body["messages"], "chat_template_kwargs": {"add_generation_prompt": False}}
    assert _tokenize(stack, kwargs)["tokens"] == bare["tokens"]
    text = _tokenize(stack, {"prompt": "Hello there"})
    assert httpx.post(root_url(stack) + "/detokenize", json={"tokens": text["tokens"]}, timeout=30).json() == {"prompt": "Hello there"}
    bad = httpx.post(root_url(stack) + "/detokenize", json={"tokens": [10**9]}, timeout=30)
    assert bad.status_code == 400 and "outside the vocabulary" in bad.json()["error"]["message"]


def test_version_and_models_describe_the_server(stack):
    assert httpx.get(root_url(stack) + "/version", timeout=30).json()["version"]
    [model] = client_for(stack).models.list().data
    assert model.id == "tiny" and model.root == "tiny" and model.max_model_len > 0


def _tokenize(stack, body) -> dict:
    response = httpx.post(root_url(stack) + "/tokenize", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _ignore_eos() -> dict:
    return {"extra_body": {"ignore_eos": True}}


def _data_url(data: bytes) -> str:
    from tests.factories import data_url

    return data_url(data, "image/png")


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_json_schema_output_parses_and_validates_streamed_or_not(stack):
    format_ = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    extra = {"structured_outputs": {"disable_any_whitespace": True}}
    messages = [{"role": "user", "content": "A person, as JSON."}]
    client = client_for(stack)
    reply = client.chat.completions.create(model="tiny", messages=messages, response_format=format_, max_tokens=64, extra_body=extra)
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), PERSON)
    chunks = client.chat.completions.create(
        model="tiny", messages=messages, response_format=format_, max_tokens=64, temperature=1.0, seed=7, stream=True, extra_body=extra
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), PERSON)


def test_vllm_structured_outputs_and_guided_fields(stack):
    choice = greedy_chat(stack, [{"role": "user", "content": "Pick."}], extra_body={"structured_outputs": {"choice": ["red", "blue"]}})
    regex = greedy_chat(stack, [{"role": "user", "content": "A code."}], extra_body={"guided_regex": "[A-Z]{2}[0-9]{2}"})
    assert choice.choices[0].message.content in ("red", "blue")
    assert re.fullmatch("[A-Z]{2}[0-9]{2}", regex.choices[0].message.content)
    bad = httpx.post(
        stack.base_url + "/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "guided_regex": "[a"}, timeout=60
    )
    assert bad.status_code == 400 and "invalid regex constraint" in bad.json()["error"]["message"]


def test_a_required_tool_call_validates_and_a_named_one_streams(stack):
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"enum": ["Oslo", "Rome"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                "required": ["city", "days"],
                "additionalProperties": False,
            },
        },
    }
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    client = client_for(stack)
    reply = client.chat.completions.create(
        model="tiny", messages=messages, tools=[weather], tool_choice="required", parallel_tool_calls=False, max_tokens=200
    )
    [call] = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), weather["function"]["parameters"])
    named = {"type": "function", "function": {"name": "get_weather"}}
    chunks = list(
        client.chat.completions.create(model="tiny", messages=messages, tools=[weather], tool_choice=named, max_tokens=64, stream=True)
    )
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    assert deltas[0].function.name == "get_weather" and deltas[0].id
    jsonschema.validate(json.loads("".join(d.function.arguments or "" for d in deltas)), weather["function"]["parameters"])


def test_metrics_carry_vllms_names_with_the_model_name(stack):
    from prometheus_client.parser import text_string_to_metric_families

    from tests.services.gateway.metrics.test_metrics import VLLM_NAMES

    greedy_chat(stack, [{"role": "user", "content": "Count the metrics."}], **_ignore_eos())
    text = httpx.get(root_url(stack) + "/metrics", timeout=30).text
    families = {family.name: family for family in text_string_to_metric_families(text)}
    for name, kind in VLLM_NAMES.items():
        assert families[name].type == kind and {s.labels["model_name"] for s in families[name].samples} == {"tiny"}, name
    generated = next(s.value for s in families["tessera:generation_tokens"].samples if s.name.endswith("_total"))
    assert generated >= 12 and "process_resident_memory_bytes" in families


def test_return_token_ids_are_the_prompt_and_output_transformers_sees_and_makes(stack, oracle):
    case = chat_case(png(70, 56, 8), "Which shapes are there?")
    reply = greedy_chat(stack, case.body["messages"], extra_body={"return_token_ids": True, "ignore_eos": True})
    inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images)
    assert reply.model_extra["prompt_token_ids"] == list(inputs.token_ids)
    assert reply.choices[0].model_extra["token_ids"] == list(oracle.generate(inputs, 12).token_ids)


def test_completions_echo_prepends_the_prompt_text_or_its_detokenized_ids(stack):
    client = client_for(stack)
    plain = client.completions.create(model="tiny", prompt="The sky is", max_tokens=4, temperature=0)
    echoed = client.completions.create(model="tiny", prompt="The sky is", max_tokens=4, temperature=0, echo=True)
    assert echoed.choices[0].text == "The sky is" + plain.choices[0].text
    ids = httpx.post(root_url(stack) + "/tokenize", json={"model": "tiny", "prompt": "The sky is"}).json()["tokens"]
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=4, temperature=0, echo=True)
    assert by_ids.choices[0].text == echoed.choices[0].text


def assert_prompt_logprobs_equal(wire: list, expected, token_ids: list[int], k: int) -> None:
    """vLLM's shape: null first, then {token id: {logprob, rank, decoded_token}}, the prompt
    token first and the k most likely after it."""
    assert wire[0] is None and len(wire) == len(token_ids)
    for position, entry in enumerate(wire[1:], start=1):
        row, token_id = expected[position - 1], token_ids[position]
        ids = [int(key) for key in entry]
        assert ids[0] == token_id and len(ids) - (token_id in ids[1:]) in (k, k + 1)
        for key, value in entry.items():
            assert abs(value["logprob"] - row[int(key)].item()) < 1e-4, position
            assert value["rank"] >= 1 and isinstance(value["decoded_token"], str)
        assert ids[1:] == row.topk(k).indices.tolist() or k == 0


def test_prompt_logprobs_equal_transformers_cold_and_on_a_prefix_hit(stack, oracle):
    case = chat_case(png(64, 48, 31), "Score every token of this question about the picture, twice.")
    inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images)
    expected = oracle.prompt_logprobs(inputs)
    client = client_for(stack)

    def ask(**extra):
        return client.chat.completions.create(model="tiny", messages=case.body["messages"], temperature=0, max_tokens=2, **extra)

    cold = ask(extra_body={"prompt_logprobs": 2})
    assert_prompt_logprobs_equal(cold.model_extra["prompt_logprobs"], expected, inputs.token_ids, 2)
    assert ask().usage.prompt_tokens_details.cached_tokens > 0  # the prompt's prefix is cached now ...
    hit = ask(extra_body={"prompt_logprobs": 2})
    assert hit.usage.prompt_tokens_details.cached_tokens == 0  # ... yet recomputed for its logprobs
    assert_prompt_logprobs_equal(hit.model_extra["prompt_logprobs"], expected, inputs.token_ids, 2)
    assert ask().model_extra.get("prompt_logprobs") is None  # not asked for


def test_completions_echo_with_logprobs_and_no_tokens_scores_the_prompt(stack, oracle):
    prompt = "The quick brown fox jumps over the lazy dog"
    inputs = oracle.process(prompt, [])
    expected = oracle.prompt_logprobs(inputs)
    scored = client_for(stack).completions.create(model="tiny", prompt=prompt, max_tokens=0, echo=True, logprobs=1, temperature=0)
    choice = scored.choices[0]
    assert choice.text == prompt
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == len(inputs.token_ids) and "".join(logprobs.tokens) == prompt
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    for position, value in enumerate(logprobs.token_logprobs[1:], start=1):
        assert abs(value - expected[position - 1][inputs.token_ids[position]].item()) < 1e-4, position
    assert all(1 <= len(top) <= 2 for top in logprobs.top_logprobs[1:])


def test_allowed_and_named_logprob_token_ids_as_transformers_with_tokens_named_by_id(stack, oracle):
    case = chat_case("Pick one of the allowed tokens.")
    allowed, named = [40, 97, 311, 1000], [7, 1000]
    extra = {"allowed_token_ids": allowed, "logprob_token_ids": named, "return_tokens_as_token_ids": True, "ignore_eos": True}
    reply = greedy_chat(stack, case.body["messages"], max_tokens=4, logprobs=True, extra_body=extra)
    inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images)
    reference = oracle.generate(inputs, 4, prefix_allowed_tokens_fn=lambda batch, ids: allowed)
    content = reply.choices[0].logprobs.content
    assert [int(entry.token.removeprefix("token_id:")) for entry in content] == reference.token_ids
    for entry, logits in zip(content, reference.step_logits):
        expected = torch.log_softmax(logits, dim=-1)  # the raw model's: a token outside the set stays finite
        sampled = int(entry.token.removeprefix("token_id:"))
        assert [t.token for t in entry.top_logprobs] == [f"token_id:{t}" for t in dict.fromkeys([sampled, *named])]
        assert all(abs(t.logprob - expected[int(t.token[9:])].item()) < 1e-4 for t in entry.top_logprobs)
    stream = client_for(stack).completions.create(
        model="tiny",
        prompt="Hello",
        max_tokens=1,
        temperature=0,
        logprobs=5,
        stream=True,
        extra_body={**extra, "logprob_token_ids": [5000]},
    )
    tops = [
        top for chunk in stream for top in (chunk.choices[0].logprobs.top_logprobs or []) if chunk.choices and chunk.choices[0].logprobs
    ]
    assert len(tops) == 1 and len(tops[0]) == 2 and "token_id:5000" in tops[0]


def test_batch_chat_answers_each_conversation_as_transformers_and_counts_every_prompt(stack, oracle):
    cases = [chat_case("Reply with the word alpha."), chat_case(png(40, 40, 5), "And this one?")]
    body = {"model": "tiny", "messages": [c.body["messages"] for c in cases], "temperature": 0, "max_tokens": 6, "ignore_eos": True}
    reply = httpx.post(stack.base_url + "/chat/completions/batch", json={**body, "return_token_ids": True}, timeout=120)
    assert reply.status_code == 200, reply.text
    choices, usage = reply.json()["choices"], reply.json()["usage"]
    assert [c["index"] for c in choices] == [0, 1]
    num_prompt_tokens = 0
    for case, choice in zip(cases, choices):
        inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images)
        assert choice["token_ids"] == oracle.generate(inputs, 6).token_ids
        num_prompt_tokens += len(inputs.token_ids)
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (num_prompt_tokens, 12)
    streamed = httpx.post(stack.base_url + "/chat/completions/batch", json={**body, "stream": True}, timeout=60)
    assert streamed.status_code == 400 and "stream" in streamed.json()["error"]["message"]


def test_truncate_prompt_tokens_keeps_the_side_asked_and_generates_as_transformers_on_what_is_kept(stack, oracle):
    client = client_for(stack)
    ids = httpx.post(root_url(stack) + "/tokenize", json={"model": "tiny", "prompt": "one two three four five six seven"}).json()["tokens"]
    for side, kept in (("left", ids[-4:]), ("right", ids[:4])):
        extra = {"return_token_ids": True, "truncate_prompt_tokens": 4, "truncation_side": side, "ignore_eos": True}
        reply = client.completions.create(model="tiny", prompt=ids, max_tokens=5, temperature=0, extra_body=extra)
        assert reply.choices[0].model_extra["prompt_token_ids"] == kept and reply.usage.prompt_tokens == 4
        reference = oracle.generate(OracleInputs(torch.tensor([kept]), None, None, None), 5)
        assert reply.choices[0].model_extra["token_ids"] == reference.token_ids
    case = chat_case(png(40, 40, 2), "Describe it.")
    try:
        greedy_chat(stack, case.body["messages"], extra_body={"truncate_prompt_tokens": 8})
        raise AssertionError("a prompt with an image was cut")
    except openai.BadRequestError as exc:
        assert "images or videos" in str(exc)


def test_beam_search_choices_are_transformers_beams_best_first(stack, oracle):
    case = chat_case("Search for the best continuation.")
    inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images)
    with torch.inference_mode():
        beams = oracle.model.generate(
            input_ids=inputs.input_ids, num_beams=3, num_return_sequences=3, do_sample=False, max_new_tokens=5, min_new_tokens=0
        )
    expected = [row[len(inputs.token_ids) :].tolist() for row in beams]
    reply = greedy_chat(stack, case.body["messages"], max_tokens=5, n=3, extra_body={"use_beam_search": True, "return_token_ids": True})
    assert [c.model_extra["token_ids"] for c in reply.choices] == expected
    assert reply.usage.completion_tokens == 15 and {c.finish_reason for c in reply.choices} == {"length"}
    client = client_for(stack)
    batch = client.completions.create(
        model="tiny", prompt=["Hello, my name is"] * 2, n=2, max_tokens=5, temperature=0, extra_body={"use_beam_search": True}
    )
    texts = [c.text for c in batch.choices]
    assert len(texts) == 4 and texts[0] != texts[1] and texts[:2] == texts[2:]
    stream = client.completions.create(
        model="tiny", prompt="Hello, my name is", n=2, max_tokens=5, temperature=0, stream=True, extra_body={"use_beam_search": True}
    )
    streamed = ["", ""]
    for chunk in stream:
        streamed[chunk.choices[0].index] += chunk.choices[0].text
    assert streamed == texts[:2]
