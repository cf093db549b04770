"""The LoRA adapters one node can serve, by name: read at start from ``--lora-modules`` (every role
reads the same list), added and removed at runtime. A request names its adapter with a LoraRef;
the node serves it only with the adapter of that name whose fingerprint matches, so a request
never runs with a stale or different copy (a changed file has another fingerprint).

Bounded memory, as vLLM's ``--max-cpu-loras``: every served adapter is known by its files, but at
most ``max_loaded`` of them are held in memory, least recently used first out; one asked for
again is read from its files again (its fingerprint checked anew). A request holds its own
adapter while it runs, so dropping one here never harms it."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

from services.models.checkpoint import WeightGroup
from services.models.lora.adapter import LoraAdapter, read_adapter
from services.models.lora.files import adapter_directory
from services.models.lora.modules import LoraModule
from shared.types import LoraRef


class LoraUnavailableError(LookupError):
    """The adapter a request names is not served here, or here differs from the caller's: the
    caller may load it here (a node that started after a runtime load lacks it)."""


class LoraRegistry:
    def __init__(
        self,
        weight_group: WeightGroup,
        *,
        max_rank: int,
        max_loaded: int,
        modules: Sequence[LoraModule] = (),
        check: Callable[[LoraAdapter], None] | None = None,
    ) -> None:
        """``check``: raises LoraAdapterError unless the adapter fits the model's layers (the
        model runner's LoraBank.check), run on every adapter read."""
        if max_loaded <= 0:
            raise ValueError("max_loaded must be positive")
        self.check = check
        self.weight_group = weight_group
        self.max_rank = max_rank
        self.max_loaded = max_loaded
        self._lock = threading.Lock()  # resolve reads files in a worker thread; loads run in others
        self._served: dict[str, tuple[LoraModule, str]] = {}  # name -> (module, fingerprint)
        self._loaded: OrderedDict[str, LoraAdapter] = OrderedDict()  # name -> adapter, least recently used first
        self.num_reads = 0  # adapters read from their files, ever
        for module in modules:
            self.add(module)

    def add(self, module: LoraModule) -> LoraAdapter:
        """Read ``module``'s adapter (checking it fits this model) and serve it under its name,
        replacing one of that name."""
        adapter = self._read(module)
        with self._lock:
            self._served[module.name] = (module, adapter.fingerprint)
            self._keep(adapter)
        return adapter

    def remove(self, name: str) -> bool:
        with self._lock:
            self._loaded.pop(name, None)
            return self._served.pop(name, None) is not None

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._served)

    def fingerprint(self, name: str) -> str | None:
        """The fingerprint of the adapter served as ``name``; None when none is."""
        with self._lock:
            served = self._served.get(name)
            return None if served is None else served[1]

    def loaded_bytes(self) -> int:
        with self._lock:
            return sum(adapter.num_bytes for adapter in self._loaded.values())

    def resolve(self, ref: LoraRef | None) -> LoraAdapter | None:
        """The adapter ``ref`` names, read from its files if it is not held (a thread's call:
        it may read a file)."""
        if ref is None:
            return None
        with self._lock:
            served = self._served.get(ref.name)
            if served is None:
                raise LoraUnavailableError(f"LoRA adapter {ref.name!r} is not loaded on this node")
            module, fingerprint = served
            if fingerprint != ref.fingerprint:
                raise LoraUnavailableError(
                    f"LoRA adapter {ref.name!r} on this node ({fingerprint}) is not the one asked for ({ref.fingerprint})"
                )
            adapter = self._loaded.get(ref.name)
            if adapter is not None:
                self._loaded.move_to_end(ref.name)
                return adapter
        adapter = self._read(module)
        if adapter.fingerprint != ref.fingerprint:  # its files changed since it was loaded
            raise LoraUnavailableError(f"LoRA adapter {ref.name!r}: its files on this node changed since it was loaded")
        with self._lock:
            if self._served.get(ref.name, (None, None))[1] == fingerprint:
                self._keep(adapter)
        return adapter

    def _read(self, module: LoraModule) -> LoraAdapter:
        self.num_reads += 1
        adapter = read_adapter(module.name, adapter_directory(module.path), self.weight_group, max_rank=self.max_rank)
        if self.check is not None:
            self.check(adapter)
        return adapter

    def _keep(self, adapter: LoraAdapter) -> None:
        """Hold ``adapter`` (lock held), dropping the least recently used beyond the bound."""
        self._loaded[adapter.name] = adapter
        self._loaded.move_to_end(adapter.name)
        while len(self._loaded) > self.max_loaded:
            self._loaded.popitem(last=False)
