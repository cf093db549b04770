"""LoRA adapters made by ``peft`` itself for the built-in checkpoints, and the oracle's model with
one merged in by ``peft`` (merge_and_unload): what the LoRA tests compare with."""

from __future__ import annotations

from pathlib import Path

import torch

# The text decoder's projections in every built-in family (a Qwen3.5 linear-attention layer's own
# projections are not among them, as PEFT's default targets leave them too).
LANGUAGE_TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
# The same, plus the vision tower's linear layers (attention and MLP) in every built-in family:
# Qwen-VL's blocks and merger, Gemma3's SigLIP encoder.
TOWER_TARGETS = (
    LANGUAGE_TARGETS
    + r"|.*(visual|vision_tower).*\.(qkv|attn\.proj|q_proj|k_proj|v_proj|out_proj|fc1|fc2|linear_fc1|linear_fc2|mlp\.0|mlp\.2)"
)


def make_adapter(model_dir: Path, out: Path, *, seed: int, rank: int = 8, alpha: int = 16, targets: str = LANGUAGE_TARGETS) -> Path:
    """A PEFT LoRA adapter on ``model_dir`` with random A and B (init_lora_weights=False: not the
    no-op PEFT starts training from), saved to ``out`` as peft saves it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32)
    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, init_lora_weights=False)
    peft_model = get_peft_model(model, config)
    with torch.no_grad():  # B scaled down: an update of the base's order, not one that drowns it
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.mul_(0.5)
    peft_model.save_pretrained(str(out))
    return out


def merged_model(model_dir: Path, adapter_dir: Path):
    """transformers' model with the adapter merged into its weights by peft."""
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    base = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32)
    return PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload().eval()
