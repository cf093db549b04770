"""Typed configuration from CLI flags and environment variables, for any frozen dataclass.

Precedence: CLI flag > ``<PREFIX><FIELD>`` environment variable > the dataclass default.
Values are parsed by the field's annotation: bool (1/0, true/false, yes/no, on/off), int, float,
str, Path (expanded, resolved), tuple[str, ...] (comma-separated), each optionally ``| None``.
Validation stays in each dataclass's ``__post_init__``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls: type, title: str) -> None:
    group = parser.add_argument_group(title)
    for f in fields(cls):
        flag = "--" + f.name.replace("_", "-")
        if _base_type(f.type) == "bool":
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        else:
            group.add_argument(flag, default=None, help="comma-separated" if _base_type(f.type).startswith("tuple") else None)


def dataclass_from_sources(
    cls: type[T], env_prefix: str, args: argparse.Namespace | None = None, env: Mapping[str, str] | None = None, **overrides
) -> T:
    env = os.environ if env is None else env
    values: dict[str, object] = {}
    for f in fields(cls):
        raw = getattr(args, f.name, None) if args is not None else None
        if raw is None:
            raw = env.get(env_prefix + f.name.upper())
        if raw is not None:
            values[f.name] = parse_value(f.name, f.type, raw)
    values.update(overrides)
    return cls(**values)


def _base_type(annotation: object) -> str:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    return text.replace("| None", "").strip()


def parse_value(name: str, annotation: object, raw: object) -> object:
    if not isinstance(raw, str):
        return raw
    text, kind = raw.strip(), _base_type(annotation)
    try:
        if kind == "bool":
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
            raise ValueError(text)
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        if kind == "Path":
            return Path(text).expanduser().resolve()
        if kind.startswith("tuple"):
            return tuple(part.strip() for part in text.split(",") if part.strip())
        return text
    except ValueError:
        raise ValueError(f"invalid value for {name}: {raw!r}") from None
