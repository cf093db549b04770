"""The LoRA adapters one node can serve, by name: read at start from ``--lora-modules`` (every role
reads the same list), added and removed at runtime. A request names its adapter with a LoraRef;
the node serves it only with the adapter of that name whose fingerprint matches, so a request
never runs with a stale or different copy (a changed file has another fingerprint)."""

from __future__ import annotations

from collections.abc import Sequence

from services.models.checkpoint import WeightGroup
from services.models.lora.adapter import LoraAdapter, read_adapter
from services.models.lora.files import adapter_directory
from services.models.lora.modules import LoraModule
from shared.types import LoraRef


class LoraUnavailableError(LookupError):
    """The adapter a request names is not served here, or here differs from the caller's: the
    caller may load it here (a node that started after a runtime load lacks it)."""


class LoraRegistry:
    def __init__(self, weight_group: WeightGroup, *, max_rank: int, modules: Sequence[LoraModule] = ()) -> None:
        self.weight_group = weight_group
        self.max_rank = max_rank
        self._by_name: dict[str, LoraAdapter] = {}
        for module in modules:
            self.add(module)

    def add(self, module: LoraModule) -> LoraAdapter:
        """Read ``module``'s adapter and serve it under its name (replacing one of that name)."""
        adapter = read_adapter(module.name, adapter_directory(module.path), self.weight_group, max_rank=self.max_rank)
        self._by_name[module.name] = adapter
        return adapter

    def remove(self, name: str) -> LoraAdapter | None:
        return self._by_name.pop(name, None)

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def adapters(self) -> list[LoraAdapter]:
        return [self._by_name[name] for name in self.names()]

    def resolve(self, ref: LoraRef | None) -> LoraAdapter | None:
        if ref is None:
            return None
        adapter = self._by_name.get(ref.name)
        if adapter is None:
            raise LoraUnavailableError(f"LoRA adapter {ref.name!r} is not loaded on this node")
        if adapter.fingerprint != ref.fingerprint:
            raise LoraUnavailableError(
                f"LoRA adapter {ref.name!r} on this node ({adapter.fingerprint}) is not the one asked for ({ref.fingerprint})"
            )
        return adapter
