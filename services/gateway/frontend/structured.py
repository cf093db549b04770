"""A request's structured-output fields, in every spelling clients use (the fields:
protocol/sampling_request.py), reduced to one engine constraint (services/engine/sampling.py
StructuredOutput). At most one constraint per request: two are a 400, not a silent pick."""

from __future__ import annotations

import json

from services.engine.sampling_params import StructuredOutput
from services.gateway.errors import GatewayError
from services.gateway.protocol.sampling_request import SamplingRequest

ANY_OBJECT = json.dumps({"type": "object"})


def structured_output(request: SamplingRequest) -> StructuredOutput | None:
    found = [(name, constraint) for name, constraint in _constraints(request) if constraint is not None]
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise GatewayError(400, f"{found[1][0]}: ask for one structured output at a time, not {names}", param=found[1][0])
    return found[0][1] if found else None


def _constraints(request: SamplingRequest) -> list[tuple[str, StructuredOutput | None]]:
    fields, response_format = request.structured_outputs, request.response_format
    compact = bool(fields and fields.disable_any_whitespace)
    out: list[tuple[str, StructuredOutput | None]] = [
        ("guided_json", _json(request.guided_json, compact)),
        ("guided_regex", StructuredOutput("regex", request.guided_regex) if request.guided_regex else None),
        ("guided_choice", StructuredOutput("choice", json.dumps(request.guided_choice)) if request.guided_choice else None),
        ("guided_grammar", StructuredOutput("grammar", request.guided_grammar) if request.guided_grammar else None),
    ]
    if response_format is not None and response_format.type == "json_object":
        out.append(("response_format", StructuredOutput("json", ANY_OBJECT)))
    elif response_format is not None and response_format.type == "json_schema":
        schema = response_format.json_schema.schema_ if response_format.json_schema else None
        if schema is None:
            raise GatewayError(400, "response_format: json_schema needs json_schema.schema", param="response_format")
        out.append(("response_format", _json(schema, compact)))
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
