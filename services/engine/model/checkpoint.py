"""Read a Hugging Face Qwen2-VL / Qwen2.5-VL checkpoint: config and safetensors weights.

Weight names are normalized to two groups, whatever the checkpoint's vintage:
  text:   "model.language_model.X" | "model.X"   -> "X"   (plus "lm_head.weight")
  vision: "model.visual.X" | "visual.X"           -> "X"
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open


@dataclass(frozen=True, slots=True)
class TextConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    mrope_section: tuple[int, ...]
    tie_word_embeddings: bool


@dataclass(frozen=True, slots=True)
class CheckpointConfig:
    model_type: str
    text: TextConfig
    raw: dict
    image_token_id: int
    eos_token_ids: tuple[int, ...]


def load_config(path: Path) -> CheckpointConfig:
    raw = json.loads((path / "config.json").read_text())
    text = raw.get("text_config") or raw
    rope = text.get("rope_parameters") or text.get("rope_scaling") or raw.get("rope_scaling") or {}
    num_heads = text["num_attention_heads"]
    tie = raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    eos: list[int] = []
    gen_path = path / "generation_config.json"
    if gen_path.is_file():
        gen_eos = json.loads(gen_path.read_text()).get("eos_token_id")
        eos = gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else []
    if not eos:
        text_eos = text.get("eos_token_id", raw.get("eos_token_id"))
        eos = text_eos if isinstance(text_eos, list) else [text_eos] if text_eos is not None else []
    return CheckpointConfig(
        model_type=raw["model_type"],
        text=TextConfig(
            vocab_size=text["vocab_size"],
            hidden_size=text["hidden_size"],
            intermediate_size=text["intermediate_size"],
            num_layers=text["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=text.get("num_key_value_heads") or num_heads,
            head_dim=text.get("head_dim") or text["hidden_size"] // num_heads,
            rms_norm_eps=text.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta", text.get("rope_theta", raw.get("rope_theta", 1000000.0))),
            mrope_section=tuple(rope.get("mrope_section", (16, 24, 24))),
            tie_word_embeddings=bool(tie),
        ),
        raw=raw,
        image_token_id=raw.get("image_token_id", 151655),
        eos_token_ids=tuple(int(e) for e in eos),
    )


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return sorted({path / name for name in json.loads(index.read_text())["weight_map"].values()})
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {path}")
    return files


def load_weights(path: Path, dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(text weights, vision weights) with normalized names."""
    text: dict[str, torch.Tensor] = {}
    vision: dict[str, torch.Tensor] = {}
    for file in _weight_files(path):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                tensor = handle.get_tensor(name).to(dtype)
                if name.startswith(("model.visual.", "visual.")):
                    vision[name.split("visual.", 1)[1]] = tensor
                elif name.startswith("model.language_model."):
                    text[name[len("model.language_model.") :]] = tensor
                elif name.startswith("model."):
                    text[name[len("model.") :]] = tensor
                elif name == "lm_head.weight":
                    text[name] = tensor
    return text, vision
