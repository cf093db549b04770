"""How a checkpoint's hidden states become one embedding, read as vLLM reads it for
``--runner pooling --convert embed`` on a generative checkpoint:

  * default: the last prompt token's final hidden state (after the model's final norm),
    L2-normalized (vLLM's embed pooler for decoder-only models);
  * a sentence-transformers layout overrides it: ``modules.json`` names a Pooling module whose
    ``<path>/config.json`` sets the pooling (``pooling_mode_cls_token``, ``_mean_tokens``,
    ``_lasttoken``, or ``pooling_mode``), and normalization is on only when a Normalize module
    is listed. A ``modules.json`` without a Pooling module leaves the defaults.
  * Matryoshka: ``config.json``'s ``matryoshka_dimensions`` (or ``is_matryoshka``), read through
    transformers' config class, allow a request's ``dimensions``; elsewhere they are refused.

The engine pools (services/engine/pooler.py); this module only reads the files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

ST_POOLING_TYPES = frozenset({"sentence_transformers.models.Pooling", "sentence_transformers.sentence_transformer.modules.pooling.Pooling"})
ST_NORMALIZE_TYPES = frozenset(
    {
        "sentence_transformers.models.Normalize",
        "sentence_transformers.base.modules.normalize.Normalize",
        "sentence_transformers.sentence_transformer.modules.normalize.Normalize",
    }
)


class PoolingKind(StrEnum):
    LAST = "last"  # the last prompt token's hidden state
    CLS = "cls"  # the first prompt token's
    MEAN = "mean"  # the mean over every prompt token's


@dataclass(frozen=True, slots=True)
class PoolingConfig:
    kind: PoolingKind = PoolingKind.LAST
    normalize: bool = True
    hidden_size: int = 0  # the embedding's size before any ``dimensions``
    matryoshka: bool = False  # a request may ask for fewer dimensions
    matryoshka_dimensions: tuple[int, ...] | None = None  # when set, the only sizes it may ask for


def read_pooling_config(path: Path, hf_config: object, hidden_size: int) -> PoolingConfig:
    """The checkpoint's pooling. ``hf_config``: its config.json as transformers' class reads it
    (ModelConfig.hf); ``hidden_size``: its text model's (the embedding's size)."""
    kind, normalize = _sentence_transformers(path)
    dims = getattr(hf_config, "matryoshka_dimensions", None)
    return PoolingConfig(
        kind=kind,
        normalize=normalize,
        hidden_size=hidden_size,
        matryoshka=bool(dims) or bool(getattr(hf_config, "is_matryoshka", False)),
        matryoshka_dimensions=tuple(int(d) for d in dims) if dims else None,
    )


def _sentence_transformers(path: Path) -> tuple[PoolingKind, bool]:
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return PoolingKind.LAST, True
    modules = json.loads(modules_file.read_text())
    pooling = next((m for m in modules if m.get("type") in ST_POOLING_TYPES), None)
    if pooling is None:
        return PoolingKind.LAST, True
    normalize = any(m.get("type") in ST_NORMALIZE_TYPES for m in modules)
    config_file = path / pooling.get("path", "") / "config.json"
    settings = json.loads(config_file.read_text()) if config_file.is_file() else {}
    kinds = [
        _kind_of(v if k == "pooling_mode" else k) for k, v in settings.items() if v is True or (k == "pooling_mode" and isinstance(v, str))
    ]
    found = [k for k in kinds if k is not None]
    return (found[-1] if found else PoolingKind.LAST), normalize  # as vLLM: the last mode named wins


def _kind_of(name: str) -> PoolingKind | None:
    """sentence-transformers' names as vLLM parses them: ``pooling_mode_mean_tokens`` is MEAN,
    ``lasttoken`` LAST; names that are no sequence pooling vLLM serves (max, weightedmean, the
    include_prompt option) are passed over, as vLLM passes them."""
    name = name.removeprefix("pooling_mode_").split("_", 1)[0]
    if "lasttoken" in name or name == "last":
        return PoolingKind.LAST
    return PoolingKind(name) if name in ("cls", "mean") else None


def check_dimensions(config: PoolingConfig, model: str, dimensions: int | None) -> None:
    """vLLM's checks of a request's ``dimensions``, with its messages."""
    if dimensions is None:
        return
    if not config.matryoshka:
        raise ValueError(
            f"Model {model!r} does not support Matryoshka embeddings; dimensions must be unset (received dimensions={dimensions})."
        )
    if not 1 <= dimensions <= config.hidden_size:
        raise ValueError(f"Model {model!r} only supports dimensions in range [1, {config.hidden_size}], got {dimensions}.")
    if config.matryoshka_dimensions is not None and dimensions not in config.matryoshka_dimensions:
        raise ValueError(f"Model {model!r} only supports Matryoshka dimensions {list(config.matryoshka_dimensions)}, got {dimensions}.")
