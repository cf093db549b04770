"""The adapters a deployment serves, as vLLM's ``--lora-modules`` names them: ``name=path``, or the
JSON form ``{"name": ..., "path": ..., "base_model_name": ...}``. Every role reads the same list:
the gateway to resolve a request's ``model`` and list the adapters, the prefill and decode nodes
to load them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class LoraModule:
    name: str
    path: Path  # a directory, or a Hub id (services/models/lora/files.py's adapter_directory)
    base_model_name: str | None = None  # the served model it adapts (vLLM's field); None: the one served


def parse_lora_modules(values: Sequence[str]) -> list[LoraModule]:
    """Each value as ``name=path`` or vLLM's JSON object; raises ValueError saying which one is wrong."""
    modules: list[LoraModule] = []
    for value in values:
        value = value.strip()
        if value.startswith("{"):
            try:
                fields = json.loads(value)
            except ValueError as exc:
                raise ValueError(f"--lora-modules {value!r} is not valid JSON: {exc}") from None
            if not isinstance(fields, dict) or not isinstance(fields.get("name"), str) or not isinstance(fields.get("path"), str):
                raise ValueError(f'--lora-modules {value!r}: the JSON form needs "name" and "path" strings')
            module = LoraModule(fields["name"], Path(fields["path"]), fields.get("base_model_name"))
        else:
            name, sep, path = value.partition("=")
            if not sep or not name.strip() or not path.strip():
                raise ValueError(f"--lora-modules {value!r}: expected name=path")
            module = LoraModule(name.strip(), Path(path.strip()))
        if any(known.name == module.name for known in modules):
            raise ValueError(f"--lora-modules names {module.name!r} twice")
        modules.append(module)
    return modules
