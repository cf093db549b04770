"""Result files that name no path of the machine that wrote them: a checkout, a home directory or
a temporary folder in a committed result says where it ran, not what it measured, and differs on
every machine. Every result writer goes through ``write_json``; results another program wrote
(vLLM's client) go through ``rewrite_json``.

Paths become placeholders, the most specific first: ``<checkout>`` (the repository the bench ran
from), ``<tmp>`` (the temporary folder), ``~`` (the home directory)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]


def _prefixes() -> list[tuple[str, str]]:
    found = [(str(CHECKOUT), "<checkout>"), (str(Path(tempfile.gettempdir()).resolve()), "<tmp>"), (str(Path.home()), "~")]
    return [(path, name) for path, name in found if path not in ("/", "")]


def portable(value, prefixes: list[tuple[str, str]] | None = None):
    """``value`` (JSON-shaped) with every machine path in its strings replaced by its placeholder."""
    prefixes = _prefixes() if prefixes is None else prefixes
    if isinstance(value, str):
        for path, name in prefixes:
            value = value.replace(path, name)
        return value
    if isinstance(value, dict):
        return {portable(k, prefixes): portable(v, prefixes) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v, prefixes) for v in value]
    return value


def write_json(path: Path, result, indent: int | None = 1) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(portable(result), indent=indent) + "\n")


def rewrite_json(path: Path) -> None:
    """A result file another program wrote, made portable in place (its layout kept compact)."""
    write_json(path, json.loads(path.read_text()), indent=None)
