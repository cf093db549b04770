"""Fields a request carried that the server does not know: accepted and ignored, as vLLM does.

The wire models keep unknown fields aside (pydantic's ``extra="allow"``); this takes them out of
the validated request, so nothing downstream ever sees them, and names them by their path
(``metadata``, ``messages[1].reasoning_content``) for the log and the response header.
"""

from __future__ import annotations

import logging

from pydantic import BaseModel

log = logging.getLogger("tessera.gateway")
HEADER = "tessera-ignored-fields"


def pop_ignored_fields(model: BaseModel, prefix: str = "") -> list[str]:
    """The unknown fields' paths, in request order; ``model`` no longer holds them."""
    extra = model.__pydantic_extra__
    names = [prefix + name for name in extra or ()]
    if extra:
        extra.clear()
    for name in type(model).model_fields:
        names += _walk(getattr(model, name), prefix + name)
    return names


def _walk(value: object, path: str) -> list[str]:
    if isinstance(value, BaseModel):
        return pop_ignored_fields(value, path + ".")
    if isinstance(value, list):
        return [name for i, item in enumerate(value) for name in _walk(item, f"{path}[{i}]")]
    return []


def report_ignored_fields(model: BaseModel, route: str) -> dict[str, str]:
    """Takes the unknown fields out of ``model``, logs them once, and returns the header naming
    them (empty when there were none)."""
    names = pop_ignored_fields(model)
    if not names:
        return {}
    log.warning("%s: ignored fields the server does not know: %s", route, ", ".join(names))
    return {HEADER: ", ".join(names)}
