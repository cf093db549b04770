"""Deterministic, input-sensitive random weights for the built-in models.

Each tensor draws from its own CPU generator seeded by blake3(model seed, parameter name), so a
tensor's values depend only on (seed, name, shape): not on module construction order, thread
count or the machine. Layout:
  *norm*.weight, *ln*.weight      -> ones (RMSNorm / LayerNorm gain)
  *.bias                          -> zeros
  everything else                 -> N(0, init_std)
"""

from __future__ import annotations

import torch

from shared.hashing import digest_hex


def _is_norm_weight(name: str) -> bool:
    leaf = name.rsplit(".", 2)
    owner = leaf[-2] if len(leaf) >= 2 else ""
    return name.endswith(".weight") and ("norm" in owner or owner.startswith("ln"))


def deterministic_tensor(name: str, shape: torch.Size, *, seed: int, std: float) -> torch.Tensor:
    if name.endswith(".bias"):
        return torch.zeros(shape, dtype=torch.float32)
    if _is_norm_weight(name):
        return torch.ones(shape, dtype=torch.float32)
    generator = torch.Generator(device="cpu")
    generator.manual_seed(int(digest_hex({"seed": seed, "param": name})[:15], 16))
    return torch.randn(shape, generator=generator, dtype=torch.float32) * std


def fill_deterministic(model: torch.nn.Module, *, seed: int, std: float) -> None:
    """Overwrite every parameter of ``model`` in place; tied parameters are written once."""
    with torch.no_grad():
        for name, param in model.named_parameters(remove_duplicate=True):
            param.copy_(deterministic_tensor(name, param.shape, seed=seed, std=std))
