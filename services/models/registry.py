"""Resolve a model reference (a built-in name or a checkpoint path) to a local directory and the
family that serves it.

Adding a family: its folder under ``services/models/`` and one row in ``FAMILIES``. Resolving
reads only each family's ``FamilyInfo`` and loads no torch (the gateway resolves its model too);
``ModelRef.family`` loads the family itself, in the roles that run it. Built-in
models are built on first use into ``$TESSERA_HOME/models/<name>``, under a file lock so
concurrent processes build once. Any local checkpoint directory of a supported model type is
accepted as is; nothing is ever fetched from a hub.
"""

from __future__ import annotations

import fcntl
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from services.models.builtins.build import build_builtin, is_complete_build
from services.models.family import FamilyInfo, ModelFamily, ProgressFn
from services.models.fingerprint import fingerprint
from services.models.gemma3 import INFO as GEMMA3
from services.models.hub import HubModelError, download, parse_hub_reference
from services.models.qwen2_vl import INFO as QWEN2_VL
from services.models.qwen3_5 import INFO as QWEN3_5
from services.models.qwen3_vl import INFO as QWEN3_VL
from shared.paths import builtin_models_dir

FAMILIES: tuple[FamilyInfo, ...] = (QWEN2_VL, GEMMA3, QWEN3_VL, QWEN3_5)

MODEL_TYPE_TO_FAMILY: dict[str, FamilyInfo] = {model_type: info for info in FAMILIES for model_type in info.model_types}
BUILTIN_TO_FAMILY: dict[str, FamilyInfo] = {name: info for info in FAMILIES for name in info.builtin_names}
SUPPORTED_MODEL_TYPES = tuple(MODEL_TYPE_TO_FAMILY)


@dataclass(frozen=True, slots=True)
class ModelRef:
    # name@fingerprint (fingerprint.py): the checkpoint's identity in every mm_hash and the index
    # namespace; the same on every node serving the same bytes, different for other weights.
    model_id: str
    path: Path
    model_type: str
    name: str  # what it is called: a built-in's name, a Hub id, a directory's name
    builtin: str | None = None  # the built-in's short name ("tiny"), for a built-in

    @property
    def family(self) -> ModelFamily:
        """The family's tensor code, loaded on first use (torch with it)."""
        return MODEL_TYPE_TO_FAMILY[self.model_type].load()

    @property
    def tool_call_parser(self) -> str | None:
        return MODEL_TYPE_TO_FAMILY[self.model_type].tool_call_parser

    def weight_group(self, name: str) -> tuple[str, str] | None:
        """The family's weight-name mapping, loading no torch (FamilyInfo.weight_group)."""
        return MODEL_TYPE_TO_FAMILY[self.model_type].weight_group(name)


class ModelNotFoundError(ValueError):
    pass


def _stderr_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def builtin_path(name: str) -> Path:
    return builtin_models_dir() / name


def ensure_builtin(name: str, *, progress: ProgressFn = _stderr_progress) -> Path:
    path = builtin_path(name)
    if is_complete_build(path):
        return path
    info = BUILTIN_TO_FAMILY.get(name)
    if info is None:
        raise ModelNotFoundError(f"unknown built-in model {name!r}; choose one of {', '.join(BUILTIN_TO_FAMILY)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_complete_build(path):
            progress(f"building built-in model {name!r} into {path}")
            build_builtin(name, info.load(), path, progress=progress)
    return path


def resolve_model(reference: str, *, model_id: str | None = None, progress: ProgressFn = _stderr_progress) -> ModelRef:
    hub = parse_hub_reference(reference) if reference not in BUILTIN_TO_FAMILY else None
    if reference in BUILTIN_TO_FAMILY:
        path = ensure_builtin(reference, progress=progress)
        name = f"tessera-{reference}"
    elif hub is not None:
        try:
            path = download(hub)
        except HubModelError as exc:
            raise ModelNotFoundError(str(exc)) from None
        name = hub.repo_id  # the revision is not part of the name: the fingerprint tells versions apart
    else:
        path = Path(reference).expanduser().resolve()
        if not path.is_dir():
            raise ModelNotFoundError(
                f"model {reference!r} is neither a built-in ({', '.join(BUILTIN_TO_FAMILY)}), a checkpoint directory, "
                "nor a Hugging Face Hub id (org/name[@revision])"
            )
        name = path.name
    config_file = path / "config.json"
    try:
        model_type = json.loads(config_file.read_text()).get("model_type")
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelNotFoundError(f"{config_file} is missing or unreadable: {exc}") from None
    if model_type not in MODEL_TYPE_TO_FAMILY:
        raise ModelNotFoundError(f"model type {model_type!r} is not supported (expected {', '.join(SUPPORTED_MODEL_TYPES)})")
    builtin = reference if reference in BUILTIN_TO_FAMILY else None
    return ModelRef(model_id=model_id or f"{name}@{fingerprint(path)}", path=path, model_type=model_type, name=name, builtin=builtin)
