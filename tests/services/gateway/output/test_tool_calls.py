"""Tool-call parsing and streaming (pure logic)."""

from __future__ import annotations

import json

from services.gateway.output.formatters import ChatFormatter, ChoiceResult
from services.gateway.output.tool_calls import ToolMode, parse_hermes
from services.gateway.protocol.chat import Tool

TOOLS = (Tool.model_validate({"type": "function", "function": {"name": "wx", "parameters": {"type": "object"}}}),)


def test_hermes_calls_are_parsed_and_the_text_before_them_is_content():
    first = '<tool_call>\n{"name": "wx", "arguments": {"city": "Oslo"}}\n</tool_call>'
    text = f'Let me check.\n{first}\n<tool_call>{{"name": "wx", "arguments": {{}}}}</tool_call>'
    parsed = parse_hermes(text, "stop")
    assert parsed.content == "Let me check." and parsed.finish_reason == "tool_calls"
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("wx", {"city": "Oslo"}), ("wx", {})]
    assert parse_hermes("no calls here", "stop").calls == ()
    broken = parse_hermes("<tool_call>{not json}</tool_call>", "stop")
    assert broken.calls == () and broken.content == "<tool_call>{not json}</tool_call>"
    assert parse_hermes('<tool_call>{"name": "wx", "arguments": {}}</tool_call>', "length").finish_reason is None


def test_required_parses_the_array_and_named_is_the_arguments():
    required = ToolMode("required", TOOLS).parse('[{"name": "wx", "parameters": {"city": "Rome"}}]', "stop")
    assert required.content is None and [(c.name, c.arguments) for c in required.calls] == [("wx", '{"city": "Rome"}')]
    assert ToolMode("required", TOOLS).parse('[{"name": "wx", "param', "length").calls == ()
    named = ToolMode("named", TOOLS, "wx").parse('{"city": "Rome"}', "stop")
    assert named.calls[0].name == "wx" and named.calls[0].arguments == '{"city": "Rome"}' and named.finish_reason is None


def stream(formatter: ChatFormatter, pieces: list[str], finish: str = "stop") -> list[dict]:
    result, deltas = ChoiceResult(index=0, prompt_index=0), []
    for i, piece in enumerate(pieces):
        result.text += piece
        result.finish_reason = finish if i == len(pieces) - 1 else None
        deltas.append(formatter.delta("id", "m", result, piece, 0).choices[0].model_dump(exclude_none=True))
    return deltas


def test_auto_streams_content_holds_back_a_partial_tag_and_sends_calls_at_the_end():
    pieces = ["Sure", " <tool", "_call>", '{"name": "wx", "arguments": {"a": 1}}', "</tool_call>"]
    deltas = stream(ChatFormatter(ToolMode("auto", TOOLS)), pieces)
    assert "".join(d["delta"].get("content") or "" for d in deltas) == "Sure "
    last = deltas[-1]
    assert last["finish_reason"] == "tool_calls" and last["delta"]["tool_calls"][0]["function"] == {"name": "wx", "arguments": '{"a": 1}'}
    plain = stream(ChatFormatter(ToolMode("auto", TOOLS)), ["a <to", "ol> b"])
    assert "".join(d["delta"].get("content") or "" for d in plain) == "a <tool> b"


def test_a_named_call_streams_its_arguments():
    deltas = stream(ChatFormatter(ToolMode("named", TOOLS, "wx")), ['{"ci', 'ty": 1}'])
    first, second = (d["delta"]["tool_calls"][0] for d in deltas)
    assert first["function"] == {"name": "wx", "arguments": '{"ci'} and first["id"].startswith("call_")
    assert second["function"] == {"arguments": 'ty": 1}'} and "id" not in second
