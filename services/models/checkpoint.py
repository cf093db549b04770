"""Reading a Hugging Face checkpoint directory, for every family: its weight files, its tensors
split into text and vision groups by the family's name mapping, and its end-of-sequence ids."""

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


def eos_token_ids(path: Path, raw: dict, text: dict) -> tuple[int, ...]:
    """generation_config.json's eos ids where it names any (chat models stop on their turn end
    there), else the config's."""
    eos: list[int] = []
    gen_path = path / "generation_config.json"
    if gen_path.is_file():
        gen_eos = json.loads(gen_path.read_text()).get("eos_token_id")
        eos = gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else []
    if not eos:
        text_eos = text.get("eos_token_id", raw.get("eos_token_id"))
        eos = text_eos if isinstance(text_eos, list) else [text_eos] if text_eos is not None else []
    return tuple(int(e) for e in eos)
