"""The wire parts of the request fields that ask for structured output (the fields themselves:
sampling_request.py; their reduction to one engine constraint: frontend/sampling.py). Spellings:

- OpenAI's ``response_format``: ``json_object`` or ``json_schema`` (``text`` asks for nothing);
- vLLM's ``structured_outputs``: ``json``, ``regex``, ``choice``, ``grammar`` or
  ``json_object``, with ``disable_any_whitespace``;
- vLLM's older ``guided_json``, ``guided_regex``, ``guided_choice`` and ``guided_grammar``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from services.gateway.protocol.wire_base import NonEmptyStr, WireModel


class JsonSchemaFormat(WireModel):
    name: str | None = None
    description: str | None = None
    schema_: dict | bool | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(WireModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsField(WireModel):
    json_: dict | bool | str | None = Field(None, alias="json")
    regex: NonEmptyStr | None = None
    choice: list[str] | None = Field(None, min_length=1)
    grammar: NonEmptyStr | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False
    whitespace_pattern: str | None = Field(None, description="accepted; llguidance offers only compact or flexible whitespace")
