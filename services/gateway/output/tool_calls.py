"""Tool calls: what ``tool_choice`` asks of the output, and how the output becomes ``tool_calls``.

- ``none``: the tools are rendered by the chat template, and the output is plain content.
- ``auto``: the model decides; its text is parsed by the model family's tool-call parser.
  ``hermes`` (Qwen): each call is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
  the text before the first call is the content. A family without a parser refuses ``auto``.
- A named function: the output is constrained to that function's parameters schema, and is the
  call's ``arguments``; finish_reason stays "stop", as OpenAI reports it.
- ``required``: the output is constrained to a JSON array of one or more (one, with
  ``parallel_tool_calls: false``) ``{"name": <a tool's name>, "parameters": <its arguments>}``
  (the shape vLLM uses), each item one call; finish_reason "tool_calls".
Forced choices ride on the structured-output engine, so they work on any model.

Streaming: content streams as it comes, except a tail that could be the start of a call tag
(held back until it is not); a named call streams its arguments as they come; other calls are
sent whole when the output ends.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from services.engine.sampling_params import StructuredOutput
from services.gateway.errors import GatewayError
from services.gateway.protocol.chat import NamedToolChoice, Tool
from shared.holdback import num_held_back

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
_HERMES_CALL = re.compile(re.escape(HERMES_OPEN) + r"\s*(.*?)\s*" + re.escape(HERMES_CLOSE), re.DOTALL)
ANY_OBJECT_SCHEMA: dict = {"type": "object"}


@dataclass(frozen=True, slots=True)
class ParsedCall:
    id: str
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    content: str | None
    calls: tuple[ParsedCall, ...]
    finish_reason: str | None  # replaces the engine's when set


@dataclass(frozen=True, slots=True)
class ToolMode:
    """One request's tool handling: ``kind`` is "auto", "named" or "required"."""

    kind: str
    tools: tuple[Tool, ...]
    function: str | None = None  # the named function
    parallel: bool = True  # parallel_tool_calls: false caps "required" at one call

    def constraint(self) -> StructuredOutput | None:
        # Compact JSON: the arguments are read by programs, and a model cannot pad them with
        # whitespace until max_tokens.
        if self.kind == "named":
            return StructuredOutput("json", json.dumps(_parameters(self._tool(self.function))), compact_whitespace=True)
        if self.kind == "required":
            items = [
                {
                    "type": "object",
                    "properties": {"name": {"const": tool.function.name}, "parameters": _parameters(tool)},
                    "required": ["name", "parameters"],
                    "additionalProperties": False,
                }
                for tool in self.tools
            ]
            schema = {"type": "array", "minItems": 1, "items": {"anyOf": items}, **({} if self.parallel else {"maxItems": 1})}
            return StructuredOutput("json", json.dumps(schema), compact_whitespace=True)
        return None

    def parse(self, text: str, finish_reason: str) -> ParsedOutput:
        """The whole output as content and calls."""
        if self.kind == "named":
            return ParsedOutput(None, (ParsedCall(new_call_id(), self.function or "", text),), None)
        if self.kind == "required":
            try:
                items = json.loads(text)
                calls = tuple(ParsedCall(new_call_id(), item["name"], json.dumps(item["parameters"])) for item in items)
            except (ValueError, TypeError, KeyError):  # cut short by max_tokens: not a complete array
                return ParsedOutput(text, (), None)
            return ParsedOutput(None, calls, "tool_calls" if finish_reason == "stop" else None)
        return parse_hermes(text, finish_reason)

    def streamable_content(self, text: str) -> str:
        """The part of the output so far that may stream as content."""
        if self.kind != "auto":
            return ""
        start = text.find(HERMES_OPEN)
        if start >= 0:
            return text[:start]
        return text[: len(text) - num_held_back(text, (HERMES_OPEN,))]

    def _tool(self, name: str | None) -> Tool:
        return next(tool for tool in self.tools if tool.function.name == name)


def tool_mode_of(
    tools: list[Tool] | None, tool_choice: str | NamedToolChoice | None, parser: str | None, *, parallel: bool = True
) -> ToolMode | None:
    """The request's tool handling, or None for plain output (no tools, or ``none``)."""
    choice = tool_choice if tool_choice is not None else ("auto" if tools else "none")
    if choice == "none":
        return None
    if not tools:
        raise GatewayError(400, "tool_choice: needs tools", param="tool_choice")
    if isinstance(choice, NamedToolChoice):
        names = [tool.function.name for tool in tools]
        if choice.function.name not in names:
            message = f"tool_choice: names {choice.function.name!r}, which is not among the tools {names}"
            raise GatewayError(400, message, param="tool_choice")
        return ToolMode("named", tuple(tools), choice.function.name)
    if choice == "required":
        return ToolMode("required", tuple(tools), parallel=parallel)
    if parser != "hermes":
        raise GatewayError(
            400, "tool_choice 'auto' needs a tool-call parser, and this model family has none; use 'required' or a named function"
        )
    return ToolMode("auto", tuple(tools))


def parse_hermes(text: str, finish_reason: str) -> ParsedOutput:
    start = text.find(HERMES_OPEN)
    if start < 0:
        return ParsedOutput(text, (), None)
    calls = []
    for body in _HERMES_CALL.findall(text[start:]):
        try:
            call = json.loads(body)
            calls.append(ParsedCall(new_call_id(), call["name"], json.dumps(call.get("arguments", {}))))
        except (ValueError, TypeError, KeyError):
            return ParsedOutput(text, (), None)  # not a well-formed call: the text is content, as vLLM leaves it
    if not calls:
        return ParsedOutput(text, (), None)
    content = text[:start].strip() or None
    return ParsedOutput(content, tuple(calls), "tool_calls" if finish_reason == "stop" else None)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _parameters(tool: Tool) -> dict:
    return tool.function.parameters if tool.function.parameters is not None else ANY_OBJECT_SCHEMA
