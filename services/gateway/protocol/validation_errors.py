"""pydantic validation errors as one OpenAI error: a 400 naming the offending field."""

from __future__ import annotations

from services.gateway.errors import GatewayError


def validation_error(errors) -> GatewayError:
    """pydantic's error list as one 400 naming the field (``param``). Of a union's failed
    branches the deepest is the informative one; branches failing at the same depth are joined."""
    if not errors:
        return GatewayError(400, "invalid request")
    if errors[0].get("type") == "json_invalid":
        detail = (errors[0].get("ctx") or {}).get("error", "")
        return GatewayError(400, f"request body is not valid JSON: {detail}".rstrip(": "))
    depth = max(len(e.get("loc", ())) for e in errors)
    deepest = [e for e in errors if len(e.get("loc", ())) == depth]
    path = _field_path(deepest[0].get("loc", ()))
    messages = list(dict.fromkeys(_message(e) for e in deepest if _field_path(e.get("loc", ())) == path))
    message = " or ".join(messages)
    if not path and deepest[0].get("type") in ("model_type", "dict_type", "model_attributes_type"):
        message = "request body must be a JSON object"
    return GatewayError(400, f"{path}: {message}" if path else message, param=path or None)


def _message(error) -> str:
    ctx = error.get("ctx") or {}
    if error.get("type") == "extra_forbidden":
        return "unsupported field"
    if error.get("type") == "union_tag_invalid":
        return f"unsupported content part type {ctx.get('tag')!r} (expected {ctx.get('expected_tags')})"
    return str(error.get("msg", "invalid value")).removeprefix("Value error, ")


def _field_path(loc) -> str:
    """('body', 'messages', 0, 'content', 'list[tagged-union[...]]', 1, 'image_url', 'url') ->
    messages[0].content[1].url: the names pydantic gives union branches (``str``,
    ``list[...]``, ``ImageUrl``) and a tagged union's tag after an index are not fields."""
    out, after_tagged_index = "", False
    parts = [p for p in loc if p != "body"]
    for i, part in enumerate(parts):
        if isinstance(part, int):
            out += f"[{part}]"
            after_tagged_index = i > 0 and "tagged-union" in str(parts[i - 1])
            continue
        is_tag, after_tagged_index = after_tagged_index, False
        if is_tag or "[" in part or part in _BRANCH_NAMES or part[:1].isupper():
            continue
        out += f".{part}" if out else part
    return out


_BRANCH_NAMES = frozenset({"str", "int", "float", "bool", "constrained-str", "constrained-int", "constrained-float"})
