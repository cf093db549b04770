"""An encoder node's LoRA adapters on the vision tower: the adapters it serves (those of
--lora-modules and runtime loads, services/engine/lora/node_adapters.py), their tower updates
(services/models/lora/tower.py), and the tower passes of a batch, each of one adapter's items.
An adapter that changes the tower gives its items mm_hashes of their own (shared/hashing.py
mm_hash_for_adapter), so its embeddings are cached and shipped apart from the base model's."""

from __future__ import annotations

from collections.abc import Callable

import torch

from services.engine.config import EngineConfig
from services.engine.lora.node_adapters import NodeAdapters
from services.engine.lora.registry import LoraRegistry
from services.models.family import VisionEncoder
from services.models.lora.modules import parse_lora_modules
from services.models.lora.tower import TowerLoras
from services.models.registry import ModelRef
from shared.compute_thread import ComputeThread
from shared.types import MmHash


def tower_adapters(
    model: ModelRef, vision: VisionEncoder, compute: ComputeThread, lora: EngineConfig | None, device: str, on_change: Callable[[], None]
) -> tuple[TowerLoras | None, NodeAdapters]:
    """The tower's adapter slots (wrapped on the compute thread, which runs the tower) and the
    adapters served; neither without --enable-lora."""
    if lora is None or not lora.enable_lora:
        return None, NodeAdapters(None, on_change)
    tower = compute.run(TowerLoras, vision.module, lora.max_loras, lora.max_lora_rank, torch.device(device))
    registry = LoraRegistry(
        model.weight_group,
        max_rank=lora.max_lora_rank,
        max_loaded=lora.max_cpu_loras or lora.max_loras,
        modules=parse_lora_modules(lora.lora_modules),
        check=tower.check,
    )
    return tower, NodeAdapters(registry, on_change)


def tower_passes(mm_hashes: list[MmHash], item_of, max_rows: int) -> list[list[MmHash]]:
    """Tower passes of at most ``max_rows`` embedding rows, each of one LoRA adapter's items (or
    of items without one): an adapter runs for a whole pass."""
    by_adapter: dict[str | None, list[MmHash]] = {}
    for mm_hash in mm_hashes:
        adapter = item_of(mm_hash).adapter
        by_adapter.setdefault(adapter.fingerprint if adapter is not None else None, []).append(mm_hash)
    passes: list[list[MmHash]] = []
    for group in by_adapter.values():
        passes.append([])
        num_rows = 0
        for mm_hash in group:
            rows = item_of(mm_hash).num_embeds
            if passes[-1] and num_rows + rows > max_rows:
                passes.append([])
                num_rows = 0
            passes[-1].append(mm_hash)
            num_rows += rows
    return passes
