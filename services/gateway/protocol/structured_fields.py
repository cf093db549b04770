"""The request fields that ask for structured output, in every spelling clients use, reduced to
one engine constraint (services/engine/sampling.py StructuredOutput):

- OpenAI's ``response_format``: ``json_object`` or ``json_schema`` (``text`` asks for nothing);
- vLLM's ``structured_outputs``: ``json``, ``regex``, ``choice``, ``grammar`` or
  ``json_object``, with ``disable_any_whitespace``;
- vLLM's older ``guided_json``, ``guided_regex``, ``guided_choice`` and ``guided_grammar``.

At most one constraint per request: two are a 400, not a silent pick.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import Field

from services.engine.sampling_params import StructuredOutput
from services.gateway.errors import GatewayError
from services.gateway.protocol.wire_base import NonEmptyStr, WireModel

ANY_OBJECT = json.dumps({"type": "object"})


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


class StructuredRequestFields(WireModel):
    """Mixed into the chat and completion requests."""

    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None
    guided_json: dict | bool | str | None = None
    guided_regex: NonEmptyStr | None = None
    guided_choice: list[str] | None = Field(None, min_length=1)
    guided_grammar: NonEmptyStr | None = None
    guided_whitespace_pattern: str | None = None
    guided_decoding_backend: str | None = Field(None, description="accepted and ignored: the engine is llguidance")

    def structured_output(self) -> StructuredOutput | None:
        found = [(name, constraint) for name, constraint in self._constraints() if constraint is not None]
        if len(found) > 1:
            names = ", ".join(name for name, _ in found)
            raise GatewayError(400, f"{found[1][0]}: ask for one structured output at a time, not {names}", param=found[1][0])
        return found[0][1] if found else None

    def _constraints(self) -> list[tuple[str, StructuredOutput | None]]:
        compact = bool(self.structured_outputs and self.structured_outputs.disable_any_whitespace)
        out: list[tuple[str, StructuredOutput | None]] = [
            ("guided_json", _json(self.guided_json, compact)),
            ("guided_regex", StructuredOutput("regex", self.guided_regex) if self.guided_regex else None),
            ("guided_choice", StructuredOutput("choice", json.dumps(self.guided_choice)) if self.guided_choice else None),
            ("guided_grammar", StructuredOutput("grammar", self.guided_grammar) if self.guided_grammar else None),
        ]
        if self.response_format is not None and self.response_format.type == "json_object":
            out.append(("response_format", StructuredOutput("json", ANY_OBJECT)))
        elif self.response_format is not None and self.response_format.type == "json_schema":
            schema = self.response_format.json_schema.schema_ if self.response_format.json_schema else None
            if schema is None:
                raise GatewayError(400, "response_format: json_schema needs json_schema.schema", param="response_format")
            out.append(("response_format", _json(schema, compact)))
        fields = self.structured_outputs
        if fields is not None:
            out += [
                ("structured_outputs.json", _json(fields.json_, compact)),
                ("structured_outputs.regex", StructuredOutput("regex", fields.regex) if fields.regex else None),
                ("structured_outputs.choice", StructuredOutput("choice", json.dumps(fields.choice)) if fields.choice else None),
                ("structured_outputs.grammar", StructuredOutput("grammar", fields.grammar) if fields.grammar else None),
                ("structured_outputs.json_object", StructuredOutput("json", ANY_OBJECT, compact) if fields.json_object else None),
            ]
        return out


def _json(schema: dict | bool | str | None, compact: bool) -> StructuredOutput | None:
    if schema is None:
        return None
    return StructuredOutput("json", schema if isinstance(schema, str) else json.dumps(schema), compact)
