"""A JSON Schema's objects closed where the schema leaves them open: an object schema that lists
``properties`` (or ``patternProperties``) and says nothing of ``additionalProperties`` takes
``false``. vLLM's default structured-output engine (xgrammar, strict mode) reads schemas so, and
OpenAI's ``strict`` schemas must say so; an open object would let a model write keys of its own
without end (JSON Schema's own default is open)."""

from __future__ import annotations

# Keywords whose value maps names to subschemas, and keywords whose value is a subschema or a
# list of them: where nested object schemas are found.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMAS = (
    "additionalProperties",
    "unevaluatedProperties",
    "propertyNames",
    "items",
    "prefixItems",
    "additionalItems",
    "unevaluatedItems",
    "contains",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
)


def closed_objects(schema: object) -> object:
    """``schema`` with every open object schema closed; the input is not modified."""
    if isinstance(schema, list):
        return [closed_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed_objects(sub) for name, sub in out[key].items()}
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), dict | list):
            out[key] = closed_objects(out[key])
    lists_properties = isinstance(out.get("properties"), dict) or isinstance(out.get("patternProperties"), dict)
    if lists_properties and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out
