"""Reading a Hugging Face checkpoint directory's weights, for every family: its weight files, and
its tensors split into text and vision groups by the family's name mapping."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open

WeightGroup = Callable[[str], "tuple[str, str] | None"]
# What every node computes in, vision tower and decoder alike: the embeddings and KV pages nodes
# send each other are of this dtype, so it is one of the settings a cluster agrees on
# (shared/index/cluster_config.py).
COMPUTE_DTYPE = torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return sorted({path / name for name in json.loads(index.read_text())["weight_map"].values()})
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {path}")
    return files


def load_weights(path: Path, dtype: torch.dtype, weight_group: WeightGroup) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(text weights, vision weights), named as the family's ``weight_group`` maps them."""
    groups: dict[str, dict[str, torch.Tensor]] = {"text": {}, "vision": {}}
    for file in weight_files(path):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                mapped = weight_group(name)
                if mapped is not None:
                    group, normalized = mapped
                    groups[group][normalized] = handle.get_tensor(name).to(dtype)
    return groups["text"], groups["vision"]
