"""A node's served adapters: at most max_loaded held in memory, the rest read again when named;
a request naming another copy (another fingerprint) or an unknown name is refused."""

from __future__ import annotations

import pytest
import torch

from services.engine.lora.registry import LoraRegistry, LoraUnavailableError
from services.models.lora.modules import LoraModule
from services.models.qwen2_vl.config import weight_group
from shared.types import LoraRef
from tests.services.models.lora.test_adapter import pair, write


def test_at_most_max_loaded_are_held_and_the_rest_are_read_again_when_named(tmp_path):
    modules = [LoraModule(name, write(tmp_path / name, {"lora_alpha": alpha}, pair())) for name, alpha in (("a", 8), ("b", 16))]
    registry = LoraRegistry(weight_group, max_rank=16, max_loaded=1, modules=modules)
    a, b = (registry.resolve(LoraRef(m.name, registry.fingerprint(m.name))) for m in modules)
    assert registry.names() == ["a", "b"] and registry.loaded_bytes() == b.num_bytes  # a was dropped for b
    reads = registry.num_reads
    again = registry.resolve(LoraRef("a", a.fingerprint))
    assert registry.num_reads == reads + 1 and torch.equal(again.text["layers.0.self_attn.q_proj"].b, a.text["layers.0.self_attn.q_proj"].b)
    registry.resolve(LoraRef("a", a.fingerprint))
    assert registry.num_reads == reads + 1  # held now


def test_another_copy_or_an_unknown_name_is_refused(tmp_path):
    registry = LoraRegistry(weight_group, max_rank=16, max_loaded=2, modules=[LoraModule("a", write(tmp_path / "a", {}, pair()))])
    with pytest.raises(LoraUnavailableError, match="not the one asked for"):
        registry.resolve(LoraRef("a", "0" * 16))
    with pytest.raises(LoraUnavailableError, match="not loaded on this node"):
        registry.resolve(LoraRef("z", "0" * 16))
    assert registry.remove("a") and not registry.remove("a") and registry.names() == []
