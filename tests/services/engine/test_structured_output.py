"""Structured outputs on the engine: every kind of constraint yields complete, valid output on the
built-in model (whose random weights would never produce it alone), and requests beside a
constrained one are untouched."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from services.engine.engine import RequestRejectedError
from services.engine.json_schema_defaults import closed_objects
from services.engine.sampling_params import SamplingParams, StructuredOutput
from tests.factories import chat_case

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pet": {"enum": ["cat", "dog", "none"]},
    },
    "required": ["name", "age", "pet"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm(tiny_model):
    from services.engine.config import EngineConfig
    from services.engine.llm import LLM

    return LLM(str(tiny_model.path), EngineConfig())


BODY = chat_case("Describe a person as JSON.").prompt


def test_a_json_schema_gives_complete_valid_json_greedy_and_sampled(llm):
    spec = StructuredOutput("json", json.dumps(PERSON), compact_whitespace=True)
    params = [SamplingParams(max_tokens=64, structured=spec), SamplingParams(max_tokens=64, temperature=1.0, seed=3, structured=spec)]
    greedy, sampled = llm.generate([BODY, BODY], params)
    for result in (greedy, sampled):
        assert result.finish_reason == "stop", result.text
        jsonschema.validate(json.loads(result.text), PERSON)


@pytest.mark.parametrize(
    "kind,spec,check",
    [
        ("regex", r"[0-9]{3}-[a-z]{2}", lambda text: re.fullmatch(r"[0-9]{3}-[a-z]{2}", text)),
        ("choice", json.dumps(["yes", "no", "maybe so"]), lambda text: text in ("yes", "no", "maybe so")),
        ("grammar", 'start: "(" NUMBER ")"\nNUMBER: /[1-9][0-9]?/', lambda text: re.fullmatch(r"\([1-9][0-9]?\)", text)),
        ("grammar", 'root ::= "<" [a-c] [a-c] ">"', lambda text: re.fullmatch(r"<[a-c]{2}>", text)),  # GBNF
    ],
    ids=["regex", "choice", "lark", "gbnf"],
)
def test_each_constraint_kind_is_honoured(llm, kind, spec, check):
    [result] = llm.generate([BODY], SamplingParams(max_tokens=32, structured=StructuredOutput(kind, spec)))
    assert result.finish_reason == "stop" and check(result.text), result.text


def test_json_object_allows_any_object(llm):
    spec = StructuredOutput("json", json.dumps({"type": "object", "maxProperties": 0}), compact_whitespace=True)
    [result] = llm.generate([BODY], SamplingParams(max_tokens=16, structured=spec))
    assert json.loads(result.text) == {}


@pytest.mark.parametrize(
    "structured,message",
    [
        (StructuredOutput("json", '{"type": "objekt"}'), "invalid json constraint"),
        (StructuredOutput("json", "{not json"), "invalid json constraint"),
        (StructuredOutput("regex", "[unclosed"), "invalid regex constraint"),
        (StructuredOutput("grammar", "start: undefined_rule"), "invalid grammar constraint"),
    ],
)
def test_a_grammar_that_does_not_compile_rejects_its_request(llm, structured, message):
    with pytest.raises(RequestRejectedError, match=message):
        llm.generate([BODY], SamplingParams(max_tokens=8, structured=structured))
    [ok] = llm.generate([BODY], SamplingParams(max_tokens=4, ignore_eos=True))  # the engine goes on
    assert len(ok.token_ids) == 4


def test_plain_requests_beside_a_constrained_one_are_unchanged(llm):
    plain = SamplingParams(max_tokens=12, ignore_eos=True)
    other = chat_case("Name a colour.").prompt
    alone = [r.token_ids for r in llm.generate([BODY, other], plain)]
    spec = StructuredOutput("json", json.dumps(PERSON), compact_whitespace=True)
    together = llm.generate([BODY, other, BODY], [plain, plain, SamplingParams(max_tokens=64, structured=spec)])
    assert [r.token_ids for r in together[:2]] == alone
    jsonschema.validate(json.loads(together[2].text), PERSON)


def test_an_open_object_schema_is_closed_as_vllms_default_engine_reads_it(llm):
    """No additionalProperties: only the listed keys (vLLM's xgrammar strict mode), so a random
    model ends the object instead of writing keys of its own."""
    answer = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}}, "required": ["answer"]}
    spec = StructuredOutput("json", json.dumps(answer), compact_whitespace=True)
    [result] = llm.generate([BODY], SamplingParams(max_tokens=48, structured=spec))
    assert result.finish_reason == "stop", result.text
    assert result.text in ('{"answer":"yes"}', '{"answer":"no"}')


def test_closing_reaches_nested_objects_and_keeps_what_the_schema_says():
    schema = {
        "type": "object",
        "properties": {"inner": {"type": "object", "properties": {"x": {"type": "integer"}}}},
        "$defs": {"open": {"type": "object", "properties": {}, "additionalProperties": True}},
        "anyOf": [{"properties": {"y": {}}}],
    }
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False and closed["properties"]["inner"]["additionalProperties"] is False
    assert closed["$defs"]["open"]["additionalProperties"] is True and closed["anyOf"][0]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the input is untouched
    assert closed_objects({"type": "object"}) == {"type": "object"}  # json_object: any object
