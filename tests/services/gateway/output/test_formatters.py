"""Response and chunk shapes of both endpoints, and OpenAI's usage accounting over choices."""

from __future__ import annotations

from services.gateway.output.formatters import ChatFormatter, ChoiceResult, CompletionFormatter, usage_of
from services.gateway.output.logprobs import prompt_logprobs_wire
from services.gateway.pipeline.token_events import PromptLogprobs, PromptTokenLogprob, TokenLogprob


def test_usage_counts_each_prompt_once_and_every_choice_completion():
    choices = [
        ChoiceResult(index=1, prompt_index=0, num_tokens=4, prompt_tokens=10, cached_tokens=8),
        ChoiceResult(index=0, prompt_index=0, num_tokens=5, prompt_tokens=10, cached_tokens=0),
        ChoiceResult(index=2, prompt_index=1, num_tokens=3, prompt_tokens=6, cached_tokens=0),
    ]
    usage = usage_of(choices).model_dump()
    assert usage == {"prompt_tokens": 16, "completion_tokens": 12, "total_tokens": 28, "prompt_tokens_details": {"cached_tokens": 0}}


def test_chat_shapes():
    fmt, result = ChatFormatter(), ChoiceResult(index=0, prompt_index=0, text="hello", finish_reason="length")
    body = fmt.response("id1", "tiny", [result], usage_of([result])).model_dump()
    assert body["object"] == "chat.completion" and body["choices"][0]["message"] == {
        "role": "assistant",
        "content": "hello",
        "tool_calls": [],
    }
    assert body["choices"][0]["finish_reason"] == "length"
    assert fmt.opening("id1", "tiny", 2).choices[0].delta.role == "assistant"
    piece = fmt.delta("id1", "tiny", ChoiceResult(index=2, prompt_index=0), "he", 0).model_dump()
    assert (
        piece["object"] == "chat.completion.chunk" and piece["choices"][0]["index"] == 2 and piece["choices"][0]["delta"]["content"] == "he"
    )
    assert fmt.usage_chunk("id1", "tiny", usage_of([result])).choices == []


def test_completion_shapes():
    fmt, result = CompletionFormatter(), ChoiceResult(index=0, prompt_index=0, text=" world", finish_reason="stop")
    body = fmt.response("id1", "tiny", [result], usage_of([result])).model_dump()
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == " world"
    assert fmt.opening("id1", "tiny", 0) is None
    assert fmt.delta("id1", "tiny", ChoiceResult(index=1, prompt_index=0), "wo", 0).choices[0].text == "wo"


def with_logprobs() -> ChoiceResult:
    result = ChoiceResult(index=0, prompt_index=0, text="Hi there", finish_reason="stop", logprobs=[])
    result.add_logprobs([TokenLogprob(10, "Hi", -0.5, ((10, "Hi", -0.5), (11, "Yo", -1.5)))])
    result.add_logprobs([TokenLogprob(12, " there", float("-inf"), ((12, " there", -0.1), (13, " you", -2.0)))])
    return result


def test_chat_logprobs_in_openais_shape():
    result = with_logprobs()
    [choice] = ChatFormatter().response("id1", "tiny", [result], usage_of([result])).choices
    first, second = choice.logprobs.content
    assert (first.token, first.logprob, first.bytes) == ("Hi", -0.5, [72, 105])
    assert [(t.token, t.logprob) for t in first.top_logprobs] == [("Hi", -0.5), ("Yo", -1.5)]
    assert second.logprob == -9999.0  # JSON has no -inf
    chunk = ChatFormatter().delta("id1", "tiny", result, " there", 1)
    assert [c.token for c in chunk.choices[0].logprobs.content] == [" there"]  # only the new tokens


def test_completion_logprobs_carry_text_offsets():
    result = with_logprobs()
    [choice] = CompletionFormatter().response("id1", "tiny", [result], usage_of([result])).choices
    assert choice.logprobs.tokens == ["Hi", " there"] and choice.logprobs.text_offset == [0, 2]
    # The sampled token first (its own logprob), then the alternatives, as vLLM gives them.
    assert choice.logprobs.top_logprobs == [{"Hi": -0.5, "Yo": -1.5}, {" there": -9999.0, " you": -2.0}]
    alone = ChoiceResult(index=0, prompt_index=0, text="Hi", logprobs=[])
    alone.add_logprobs([TokenLogprob(10, "Hi", -0.5, ())])  # logprobs=0: the sampled token only
    assert CompletionFormatter().response("id1", "tiny", [alone], usage_of([alone])).choices[0].logprobs.top_logprobs == [{"Hi": -0.5}]
    assert ChoiceResult(index=0, prompt_index=0).logprobs is None  # not asked for: null in the response


def test_tokens_as_ids_name_every_logprobs_token_by_id_and_keep_text_offsets():
    result = with_logprobs()
    [chat] = ChatFormatter(tokens_as_ids=True).response("id1", "tiny", [result], usage_of([result])).choices
    first = chat.logprobs.content[0]
    assert (first.token, first.bytes) == ("token_id:10", list(b"token_id:10"))
    assert [t.token for t in first.top_logprobs] == ["token_id:10", "token_id:11"]
    result.prompt_logprobs = scored_prompt()
    fmt = CompletionFormatter(echoes=["The sky"], tokens_as_ids=True)
    [text] = fmt.response("id1", "tiny", [result], usage_of([result])).choices
    assert text.logprobs.tokens == ["token_id:900", "token_id:901", "token_id:10", "token_id:12"]
    assert text.logprobs.top_logprobs[1] == {"token_id:901": -1.25, "token_id:902": -0.5}
    assert text.logprobs.text_offset == [0, 3, 7, 9]  # offsets count the text, not the names


def scored_prompt() -> PromptLogprobs:
    """ "The sky" scored: " sky" given "The", its rank 2, with the two most likely tokens."""
    entry = PromptTokenLogprob(901, " sky", -1.25, 2, ((902, " sea", -0.5), (901, " sky", -1.25)))
    return PromptLogprobs(900, "The", (entry,))


def test_prompt_logprobs_in_vllms_shape_the_token_first_then_the_top_ones():
    wire = prompt_logprobs_wire(scored_prompt())
    assert wire[0] is None  # the first token has nothing before it
    assert [(token_id, e.logprob, e.rank, e.decoded_token) for token_id, e in wire[1].items()] == [
        (901, -1.25, 2, " sky"),
        (902, -0.5, 1, " sea"),
    ]
    result = with_logprobs()
    result.prompt_logprobs = scored_prompt()
    body = ChatFormatter().response("id1", "tiny", [result], usage_of([result])).model_dump()
    assert body["prompt_logprobs"][1][901] == {"logprob": -1.25, "rank": 2, "decoded_token": " sky"}
    [choice] = CompletionFormatter().response("id1", "tiny", [result], usage_of([result])).choices
    assert choice.prompt_logprobs == wire


def test_completion_echo_with_logprobs_scores_the_prompt_then_the_output():
    result = with_logprobs()
    result.prompt_logprobs = scored_prompt()
    formatter = CompletionFormatter(echoes=["The sky"])
    [choice] = formatter.response("id1", "tiny", [result], usage_of([result])).choices
    assert choice.text == "The skyHi there"
    assert choice.logprobs.tokens == ["The", " sky", "Hi", " there"]
    assert choice.logprobs.token_logprobs == [None, -1.25, -0.5, -9999.0]
    assert choice.logprobs.top_logprobs[:2] == [None, {" sky": -1.25, " sea": -0.5}]
    assert choice.logprobs.text_offset == [0, 3, 7, 9]
    # max_tokens 0: the prompt alone, scored
    [alone] = CompletionFormatter(echoes=["The sky"], echo_only=True).response("id1", "tiny", [result], usage_of([result])).choices
    assert alone.text == "The sky" and alone.logprobs.tokens == ["The", " sky"] and alone.logprobs.token_logprobs == [None, -1.25]
    streamed = CompletionFormatter(echoes=["The sky"], echo_only=True)
    first, later = streamed.delta("id1", "tiny", result, "Hi", 1), streamed.delta("id1", "tiny", result, " there", 1)
    assert first.choices[0].text == "The sky" and first.choices[0].logprobs.tokens == ["The", " sky"]
    assert later.choices[0].text == "" and later.choices[0].logprobs.tokens == []
