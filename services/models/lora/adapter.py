"""Reading a LoRA adapter in PEFT's format: ``adapter_config.json`` and ``adapter_model.safetensors``
in one directory, as ``peft``'s ``save_pretrained`` writes them and vLLM's ``--lora-modules`` reads
them.

Each targeted linear layer W (out x in) gets W + s * B @ A, with A (r x in) and B (out x r) from the
file and s = lora_alpha / r (lora_alpha / sqrt(r) with ``use_rslora``; both per module where
``rank_pattern`` / ``alpha_pattern`` say). PEFT names a tensor after the module in transformers'
model ("base_model.model.<module>.lora_A.weight"); the family's own weight-name mapping (the one
that loads the checkpoint) turns "<module>.weight" into our module's name, so an adapter reaches
exactly the layers the same checkpoint tensor would. B is stored scaled by s.

Modules the family maps to its vision side (the tower and the projector) go to ``vision``; an
adapter with any of them ``touches_tower``, and its image embeddings are keyed apart
(LoraRef.tower).

What we refuse, with the reason (a wrong adapter must never serve silently): DoRA, trained biases,
``modules_to_save`` (whole replaced layers), embedding or LM-head targets, ranks above
``max_rank``, and tensors that name no layer of the model.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from services.models.checkpoint import WeightGroup
from services.models.lora.files import CONFIG_FILE, PEFT_PREFIX, PEFT_TENSOR, WEIGHTS_FILE, LoraAdapterError, adapter_fingerprint
from shared.types import LoraRef


@dataclass(frozen=True, slots=True)
class LoraWeights:
    a: torch.Tensor  # (rank, in)
    b: torch.Tensor  # (out, rank), times the module's scaling

    @property
    def rank(self) -> int:
        return self.a.shape[0]


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    name: str
    path: Path
    fingerprint: str  # of its files (services/models/fingerprint.py): its identity in every cache key
    rank: int  # the largest of its modules'
    text: dict[str, LoraWeights] = field(default_factory=dict)  # decoder module name -> weights
    vision: dict[str, LoraWeights] = field(default_factory=dict)  # vision tower module name -> weights

    @property
    def touches_tower(self) -> bool:
        """Whether it changes the vision tower's output (then image embeddings are its own)."""
        return bool(self.vision)

    @property
    def ref(self) -> LoraRef:
        """How a request names it: name, fingerprint, and whether its embeddings are its own."""
        return LoraRef(self.name, self.fingerprint, self.touches_tower)

    @property
    def num_bytes(self) -> int:
        weights = [*self.text.values(), *self.vision.values()]
        return sum(w.a.numel() * w.a.element_size() + w.b.numel() * w.b.element_size() for w in weights)


def read_adapter(name: str, path: Path, weight_group: WeightGroup, *, max_rank: int, dtype: torch.dtype = torch.float32) -> LoraAdapter:
    """The adapter in directory ``path``, its tensors named as ``weight_group`` names the model's."""
    path = Path(path)
    config = _read_config(path)
    weights_file = path / WEIGHTS_FILE
    if not weights_file.is_file():
        raise LoraAdapterError(f"LoRA adapter {name!r}: no {WEIGHTS_FILE} in {path} (only safetensors adapters are read)")
    parts: dict[str, dict[str, torch.Tensor]] = {}
    with safe_open(str(weights_file), framework="pt") as handle:
        for key in handle.keys():
            match = PEFT_TENSOR.match(key.removeprefix(PEFT_PREFIX))
            if match is None:
                raise LoraAdapterError(f"LoRA adapter {name!r}: tensor {key!r} is not a lora_A / lora_B weight")
            parts.setdefault(match["module"], {})[match["part"]] = handle.get_tensor(key).to(dtype)
    groups: dict[str, dict[str, LoraWeights]] = {"text": {}, "vision": {}}
    for module, pair in sorted(parts.items()):
        if set(pair) != {"A", "B"}:
            raise LoraAdapterError(f"LoRA adapter {name!r}: module {module!r} has lora_{''.join(pair)} only")
        a, b = pair["A"], pair["B"]
        if config.get("fan_in_fan_out"):
            a, b = a.t(), b.t()
        rank = a.shape[0]
        if b.shape[1] != rank:
            raise LoraAdapterError(f"LoRA adapter {name!r}: {module!r} has A of rank {rank} but B of {b.shape[1]}")
        if rank > max_rank:
            raise LoraAdapterError(f"LoRA adapter {name!r}: rank {rank} of {module!r} is above --max-lora-rank {max_rank}")
        mapped = weight_group(module + ".weight")
        if mapped is None or mapped[1] == "lm_head.weight" or "embed" in mapped[1]:
            raise LoraAdapterError(f"LoRA adapter {name!r}: {module!r} is not a linear layer of this model that LoRA may change")
        group, ours = mapped
        scaling = _scaling(config, module, rank)
        groups[group][ours.removesuffix(".weight")] = LoraWeights(a.contiguous(), (b * scaling).contiguous())
    if not groups["text"] and not groups["vision"]:
        raise LoraAdapterError(f"LoRA adapter {name!r}: {WEIGHTS_FILE} holds no LoRA weights")
    rank = max(w.rank for group in groups.values() for w in group.values())
    return LoraAdapter(name, path, adapter_fingerprint(path), rank, groups["text"], groups["vision"])


def _read_config(path: Path) -> dict:
    config_file = path / CONFIG_FILE
    try:
        config = json.loads(config_file.read_text())
    except FileNotFoundError:
        raise LoraAdapterError(f"no {CONFIG_FILE} in {path}: not a PEFT adapter directory") from None
    except ValueError as exc:
        raise LoraAdapterError(f"{config_file} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise LoraAdapterError(f"{config_file} is not a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise LoraAdapterError(f"{config_file}: peft_type {config.get('peft_type')!r} is not LORA")
    if config.get("use_dora"):
        raise LoraAdapterError(f"{config_file}: DoRA adapters are not supported")
    if config.get("bias", "none") != "none":
        raise LoraAdapterError(f"{config_file}: trained biases (bias={config['bias']!r}) are not supported")
    if config.get("modules_to_save"):
        raise LoraAdapterError(f"{config_file}: modules_to_save ({config['modules_to_save']}) replaces whole layers; not supported")
    if not isinstance(config.get("r"), int) or not isinstance(config.get("lora_alpha"), (int, float)):
        raise LoraAdapterError(f"{config_file}: r and lora_alpha must be numbers")
    return config


def _scaling(config: dict, module: str, rank: int) -> float:
    """lora_alpha / r (or / sqrt(r)), with this module's alpha from ``alpha_pattern`` if one
    matches (PEFT's rule: the pattern is the whole name or a dotted suffix of it)."""
    alpha = config["lora_alpha"]
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if pattern == module or re.match(rf"(.*\.)?(?:{pattern})$", module):
            alpha = value
            break
    return alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
