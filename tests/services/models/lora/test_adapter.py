"""Reading PEFT adapters: names mapped through the family's weight names, scaling as PEFT applies
it, and a clear refusal of what cannot be served."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from services.models.lora.adapter import LoraAdapterError, read_adapter
from services.models.qwen2_vl.config import weight_group

PREFIX = "base_model.model.model.language_model.layers.0.self_attn"


def named_pair(module: str) -> dict[str, torch.Tensor]:
    return {f"base_model.model.{module}.lora_A.weight": torch.ones(4, 5), f"base_model.model.{module}.lora_B.weight": torch.ones(6, 4)}


def write(path, config: dict, tensors: dict[str, torch.Tensor]):
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8, **config}))
    save_file(tensors, str(path / "adapter_model.safetensors"))
    return path


def pair(rank: int = 4, out: int = 6, inp: int = 5) -> dict[str, torch.Tensor]:
    return {f"{PREFIX}.q_proj.lora_A.weight": torch.ones(rank, inp), f"{PREFIX}.q_proj.lora_B.weight": torch.ones(out, rank)}


def test_names_map_to_our_layers_and_b_carries_the_scaling(tmp_path):
    adapter = read_adapter("x", write(tmp_path / "a", {}, pair()), weight_group, max_rank=16)
    weights = adapter.text["layers.0.self_attn.q_proj"]
    assert weights.a.shape == (4, 5) and torch.equal(weights.b, torch.full((6, 4), 8 / 4))
    assert adapter.rank == 4 and not adapter.touches_tower and adapter.num_bytes == (20 + 24) * 4


def test_rslora_and_alpha_pattern_scale_as_peft_does(tmp_path):
    rs = read_adapter("rs", write(tmp_path / "rs", {"use_rslora": True}, pair()), weight_group, max_rank=16)
    assert torch.allclose(rs.text["layers.0.self_attn.q_proj"].b, torch.full((6, 4), 8 / math.sqrt(4)))
    patterned = read_adapter("p", write(tmp_path / "p", {"alpha_pattern": {"q_proj": 2}}, pair()), weight_group, max_rank=16)
    assert torch.equal(patterned.text["layers.0.self_attn.q_proj"].b, torch.full((6, 4), 2 / 4))


def test_the_fingerprint_follows_the_content(tmp_path):
    first = read_adapter("x", write(tmp_path / "a", {}, pair()), weight_group, max_rank=16)
    same = read_adapter("y", write(tmp_path / "b", {}, pair()), weight_group, max_rank=16)
    other = read_adapter("x", write(tmp_path / "c", {"lora_alpha": 16}, pair()), weight_group, max_rank=16)
    assert first.fingerprint == same.fingerprint != other.fingerprint


@pytest.mark.parametrize(
    ("config", "tensors", "message"),
    [
        ({"use_dora": True}, None, "DoRA"),
        ({"bias": "all"}, None, "biases"),
        ({"modules_to_save": ["lm_head"]}, None, "modules_to_save"),
        ({"peft_type": "IA3"}, None, "not LORA"),
        ({}, {f"{PREFIX}.q_proj.lora_A.weight": torch.ones(4, 5)}, "lora_A only"),
        ({}, named_pair("lm_head"), "LoRA may change"),
        ({}, named_pair("unknown"), "LoRA may change"),
        ({}, named_pair("model.language_model.embed_tokens"), "LoRA may change"),
        ({}, pair(rank=32), "above --max-lora-rank"),
        ({}, {f"{PREFIX}.q_proj.weight": torch.ones(6, 5)}, "not a lora_A"),
    ],
)
def test_what_cannot_be_served_is_refused_with_the_reason(tmp_path, config, tensors, message):
    path = write(tmp_path / "bad", config, tensors if tensors is not None else pair())
    with pytest.raises(LoraAdapterError, match=message):
        read_adapter("bad", path, weight_group, max_rank=16)


def test_a_directory_without_an_adapter_is_refused(tmp_path):
    with pytest.raises(LoraAdapterError, match="not a PEFT adapter"):
        read_adapter("none", tmp_path, weight_group, max_rank=16)
    (tmp_path / "adapter_config.json").write_text("{not json")
    with pytest.raises(LoraAdapterError, match="not valid JSON"):
        read_adapter("broken", tmp_path, weight_group, max_rank=16)


def test_an_adapter_named_by_hub_id_is_fetched_through_the_hub_path(tmp_path):
    """vLLM takes a Hub id for an adapter: fetched from a local Hub server here, then read."""
    import os
    import subprocess
    import sys

    from tests.hub_server import HubRepo, HubServer

    local = write(tmp_path / "adapter", {}, pair())
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0"}
    code = "from services.models.lora.files import adapter_directory; print(adapter_directory('tessera-test/adapter'))"
    with HubServer([HubRepo("tessera-test/adapter", local, "c" * 40)]) as hub:
        env["HF_ENDPOINT"] = hub.endpoint  # huggingface_hub reads it at import: a process of its own
        fetched = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert fetched.returncode == 0, fetched.stderr
    snapshot = fetched.stdout.strip().splitlines()[-1]
    adapter = read_adapter("hub", Path(snapshot), weight_group, max_rank=16)
    assert torch.equal(adapter.text["layers.0.self_attn.q_proj"].b, torch.full((6, 4), 2.0))
    missing = subprocess.run([sys.executable, "-c", code.replace("adapter'", "absent'")], env=env, capture_output=True, text=True)
    assert missing.returncode != 0 and "LoraAdapterError" in missing.stderr


def test_a_path_that_is_neither_directory_nor_hub_id_is_refused():
    from services.models.lora.files import adapter_directory

    with pytest.raises(LoraAdapterError, match="neither a directory nor a Hub id"):
        adapter_directory("/no/such/adapter")


def test_an_adapter_on_the_vision_tower_is_read_for_the_tower_and_known_as_one_without_torch(tmp_path):
    from services.models.lora.files import touches_tower

    tower = {
        "base_model.model.model.visual.blocks.0.attn.qkv.lora_A.weight": torch.ones(4, 5),
        "base_model.model.model.visual.blocks.0.attn.qkv.lora_B.weight": torch.ones(6, 4),
    }
    both = write(tmp_path / "t", {}, {**pair(), **tower})
    adapter = read_adapter("tower", both, weight_group, max_rank=16)
    assert set(adapter.vision) == {"blocks.0.attn.qkv"} and set(adapter.text) == {"layers.0.self_attn.q_proj"}
    assert adapter.touches_tower and adapter.ref.tower
    # The gateway's answer, from the safetensors header alone, is the node's.
    assert touches_tower(both, weight_group)
    assert not touches_tower(write(tmp_path / "l", {}, pair()), weight_group)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "adapter_model.safetensors").write_bytes(b"\xff" * 12)
    with pytest.raises(LoraAdapterError, match="not a readable safetensors file"):
        touches_tower(tmp_path / "broken", weight_group)
