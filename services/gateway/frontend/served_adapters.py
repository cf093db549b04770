"""The LoRA adapters the API serves beside the base model, by name: those of ``--lora-modules``
at start, and those loaded at runtime. A request names one by its ``model``; it then runs with a
LoraRef (name and content fingerprint), which every node checks its own copy against, and which
keys the request's cached work."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from services.models.lora.files import adapter_directory, adapter_fingerprint, touches_tower
from services.models.lora.modules import LoraModule
from shared.types import LoraRef


@dataclass(frozen=True, slots=True)
class ServedAdapter:
    ref: LoraRef
    path: Path  # /v1/models' root
    parent: str | None  # the served model it adapts (vLLM's base_model_name); None: the default one


class ServedAdapters:
    def __init__(
        self,
        modules: list[LoraModule] = (),
        *,
        enabled: bool = False,
        weight_group: Callable[[str], tuple[str, str] | None] = lambda name: None,
    ) -> None:
        """``enabled``: the server runs with --enable-lora (adapters may be loaded at runtime);
        ``weight_group``: the model family's weight-name mapping, which says whether an adapter
        changes the vision tower (ModelRef.weight_group, no torch)."""
        self.enabled = enabled or bool(modules)
        self.weight_group = weight_group
        # Public so the request path reads it with dict operations alone, no call into this module.
        self.by_name: dict[str, ServedAdapter] = {}
        for module in modules:
            self.add(module)

    def add(self, module: LoraModule, fingerprint: str | None = None, *, tower: bool = False) -> ServedAdapter:
        """Serve ``module``: its files fingerprinted and read for whether it changes the tower
        here, unless ``fingerprint`` (and ``tower``) come from a node that read them."""
        if fingerprint is None:
            local = adapter_directory(module.path)
            fingerprint, tower = adapter_fingerprint(local), touches_tower(local, self.weight_group)
        served = ServedAdapter(LoraRef(module.name, fingerprint, tower), module.path, module.base_model_name)
        self.by_name[module.name] = served
        return served

    def remove(self, name: str) -> ServedAdapter | None:
        return self.by_name.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self.by_name

    def __iter__(self):
        return iter([self.by_name[name] for name in sorted(self.by_name)])
