"""Typed configuration from CLI flags and environment variables, for any frozen dataclass, read
with pydantic-settings.

Precedence: CLI flag > ``<PREFIX><FIELD>`` environment variable > the dataclass default.
Each settings dataclass gets a pydantic-settings model with the same fields (built once, cached),
which reads the environment and parses every value by the field's annotation: bool (1/0,
true/false, yes/no, on/off), int, float, str, Path (expanded, resolved), tuple[str, ...]
(comma-separated), each optionally ``| None``. The dataclass is then built from the model's
values, so validation across fields stays in each dataclass's ``__post_init__``, and the flag and
variable names are the ones they always were: ``--block-size`` and ``TESSERA_ENGINE_BLOCK_SIZE``.
"""

from __future__ import annotations

import argparse
import functools
import os
import typing
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BeforeValidator, ValidationError, create_model
from pydantic_settings import BaseSettings, EnvSettingsSource, NoDecode, SettingsConfigDict

T = TypeVar("T")


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls: type, title: str, *, spaced: frozenset[str] = frozenset()) -> None:
    """``spaced``: tuple fields whose flag takes its values apart (``--flag a b``, as vLLM spells
    ``--lora-modules``; values may hold commas), each flag given adding to them."""
    group = parser.add_argument_group(title)
    for name, annotation in _field_types(cls).items():
        flag = "--" + name.replace("_", "-")
        if _base(annotation) is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        elif name in spaced:
            group.add_argument(flag, nargs="+", action="extend", default=None)
        else:
            group.add_argument(flag, default=None, help="comma-separated" if _base(annotation) is tuple else None)


def dataclass_from_sources(
    cls: type[T], env_prefix: str, args: argparse.Namespace | None = None, env: Mapping[str, str] | None = None, **overrides
) -> T:
    """``cls`` from its flags in ``args``, then ``env`` (default: the process environment), then
    its defaults; ``overrides`` win over all. Raises ValueError naming a value that does not parse."""
    model = _settings_model(cls, env_prefix)
    flags = {name: value for name in _field_types(cls) if (value := getattr(args, name, None) if args is not None else None) is not None}
    token = _ENVIRONMENT.set(env)
    try:
        settings = model(**flags)
    except ValidationError as exc:
        name = str(exc.errors()[0]["loc"][0])
        source = os.environ if env is None else env
        raise ValueError(f"invalid value for {name}: {flags.get(name, source.get(env_prefix + name.upper()))!r}") from None
    finally:
        _ENVIRONMENT.reset(token)
    values = {name: getattr(settings, name) for name in _field_types(cls)}
    return cls(**{**values, **overrides})


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


@functools.cache
def _settings_model(cls: type, env_prefix: str) -> type[BaseSettings]:
    definitions: dict[str, Any] = {}
    for f in fields(cls):
        default = f.default if f.default is not MISSING else (f.default_factory() if f.default_factory is not MISSING else ...)
        definitions[f.name] = (_pydantic_type(_field_types(cls)[f.name]), default)
    base = type(f"{cls.__name__}Sources", (_Sources,), {"model_config": SettingsConfigDict(env_prefix=env_prefix)})
    return create_model(f"{cls.__name__}Settings", __base__=base, **definitions)


# The environment a caller passed to dataclass_from_sources (tests; a launcher building a role's
# settings), for the duration of that call; None: the process environment.
_ENVIRONMENT: ContextVar[Mapping[str, str] | None] = ContextVar("tessera_settings_environment", default=None)


class _Environment(EnvSettingsSource):
    def _load_env_vars(self) -> Mapping[str, str | None]:
        mapping = _ENVIRONMENT.get()
        if mapping is None:
            return super()._load_env_vars()
        return {key.lower(): value for key, value in mapping.items()}  # the sources are case-insensitive


class _Sources(BaseSettings):
    """Flags (passed as init values), then the environment; no .env or secrets files."""

    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore")

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings):
        return init_settings, _Environment(settings_cls)


def _base(annotation: Any) -> Any:
    """The annotation without ``| None``, as a runtime class (tuple for tuple[str, ...])."""
    args = (
        [a for a in typing.get_args(annotation) if a is not type(None)]
        if typing.get_origin(annotation) in (typing.Union, _UnionType)
        else []
    )
    inner = args[0] if args else annotation
    return typing.get_origin(inner) or inner


def _pydantic_type(annotation: Any) -> Any:
    """The field's type for pydantic, with the parsing our flags and variables have always had."""
    base = _base(annotation)
    optional = type(None) in typing.get_args(annotation)
    if base is tuple:
        kind: Any = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_comma_separated)]
    elif base is Path:
        kind = Annotated[Path, AfterValidator(lambda p: p.expanduser().resolve())]
    else:
        kind = Annotated[base, BeforeValidator(lambda v: v.strip() if isinstance(v, str) else v)]
    return kind | None if optional else kind


def _comma_separated(value: Any) -> Any:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


_UnionType = type(int | None)
