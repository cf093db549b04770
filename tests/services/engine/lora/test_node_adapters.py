"""A node's adapters as its servers use them: a request naming an adapter the node lacks may have
it loaded (MissingAdapterError), one whose tower-ness disagrees with the node's copy is refused
(its items were keyed wrongly), a node without LoRA refuses every adapter, and loads and unloads
change what the node's record lists."""

from __future__ import annotations

import asyncio

import pytest
import torch

from services.engine.engine import RequestRejectedError
from services.engine.lora.node_adapters import MissingAdapterError, NodeAdapters
from services.engine.lora.registry import LoraRegistry
from services.models.lora.files import LoraAdapterError
from services.models.qwen2_vl.config import weight_group
from shared.types import LoraRef
from tests.services.models.lora.test_adapter import pair, write

TOWER = {
    "base_model.model.model.visual.blocks.0.attn.qkv.lora_A.weight": torch.ones(4, 5),
    "base_model.model.model.visual.blocks.0.attn.qkv.lora_B.weight": torch.ones(6, 4),
}


def test_resolving_loading_and_unloading(tmp_path):
    changes = []
    adapters = NodeAdapters(LoraRegistry(weight_group, max_rank=16, max_loaded=2), on_change=lambda: changes.append(1))
    tower = asyncio.run(adapters.load("t", str(write(tmp_path / "t", {}, {**pair(), **TOWER})), None))
    assert tower.touches_tower and adapters.fingerprints() == {tower.fingerprint} and changes == [1]
    assert asyncio.run(adapters.resolve(LoraRef("t", tower.fingerprint, tower=True))) is tower
    with pytest.raises(RequestRejectedError, match="leaves the vision tower"):
        asyncio.run(adapters.resolve(LoraRef("t", tower.fingerprint, tower=False)))
    with pytest.raises(MissingAdapterError):
        asyncio.run(adapters.resolve(LoraRef("other", tower.fingerprint)))
    with pytest.raises(LoraAdapterError, match="differ from the caller's"):
        asyncio.run(adapters.load("u", str(write(tmp_path / "u", {}, pair())), "0" * 16))
    assert asyncio.run(adapters.unload("t")) and adapters.fingerprints() == frozenset() and len(changes) == 2


def test_a_node_without_lora_refuses_every_adapter():
    adapters = NodeAdapters(None)
    assert asyncio.run(adapters.resolve(None)) is None
    with pytest.raises(RequestRejectedError, match="serves none"):
        asyncio.run(adapters.resolve(LoraRef("a", "0" * 16)))
    with pytest.raises(LoraAdapterError, match="serves no LoRA"):
        asyncio.run(adapters.load("a", "/nowhere", None))
