"""Built-in Gemma3 checkpoints: real Gemma3 architecture, small dimensions, deterministic weights.

``write_checkpoint`` fills an empty directory with everything a Gemma3 checkpoint holds except the
build stamp (the caller writes that last, once the directory is complete): config, float32
safetensors, generation config, tokenizer with chat template, image processor, processor config.
Weights come from ``fill_deterministic`` (values depend only on seed, parameter name and shape), then
one Gemma-specific rescale of the embedding table; two builds are byte-identical.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from services.models.builtins.gemma3_tokenizer import BOI_ID, BOS_ID, END_OF_TURN_ID, EOI_ID, EOS_ID, IMAGE_TOKEN_ID, PAD_ID, VOCAB_SIZE

if TYPE_CHECKING:
    import torch

ProgressFn = Callable[[str], None]

SLIDING = "sliding_attention"
FULL = "full_attention"


@dataclass(frozen=True, slots=True)
class Gemma3Spec:
    name: str
    seed: int
    init_std: float
    text_hidden: int
    text_layer_types: tuple[str, ...]  # one entry per layer: SLIDING or FULL
    text_heads: int
    text_kv_heads: int
    text_head_dim: int
    query_pre_attn_scalar: int
    text_intermediate: int
    sliding_window: int
    vision_image_size: int
    vision_patch_size: int
    vision_hidden: int
    vision_layers: int
    vision_heads: int
    vision_intermediate: int
    mm_tokens_per_image: int

    def __post_init__(self) -> None:
        # The projector average-pools the square patch grid down to a square token grid with an
        # integer kernel; transformers floors the kernel silently, so a bad pairing would only show
        # up as a shape error at the first image.
        patches, remainder = divmod(self.vision_image_size, self.vision_patch_size)
        side = math.isqrt(self.mm_tokens_per_image)
        if remainder or side * side != self.mm_tokens_per_image or patches % side:
            raise ValueError(
                f"{self.name}: {self.vision_image_size}px / {self.vision_patch_size}px patches does not pool "
                f"evenly to {self.mm_tokens_per_image} tokens"
            )
        if set(self.text_layer_types) - {SLIDING, FULL}:
            raise ValueError(f"{self.name}: unknown layer types {set(self.text_layer_types) - {SLIDING, FULL}}")

    def config_dict(self) -> dict:
        """A Gemma3 ``config.json`` body for this spec."""
        return {
            "architectures": ["Gemma3ForConditionalGeneration"],
            "model_type": "gemma3",
            "boi_token_index": BOI_ID,
            "eoi_token_index": EOI_ID,
            "image_token_index": IMAGE_TOKEN_ID,
            "mm_tokens_per_image": self.mm_tokens_per_image,
            "initializer_range": self.init_std,
            "tie_word_embeddings": True,
            "dtype": "float32",
            "text_config": {
                "model_type": "gemma3_text",
                "vocab_size": VOCAB_SIZE,
                "hidden_size": self.text_hidden,
                "intermediate_size": self.text_intermediate,
                "num_hidden_layers": len(self.text_layer_types),
                "layer_types": list(self.text_layer_types),
                "num_attention_heads": self.text_heads,
                "num_key_value_heads": self.text_kv_heads,
                "head_dim": self.text_head_dim,
                "query_pre_attn_scalar": self.query_pre_attn_scalar,
                "sliding_window": self.sliding_window,
                # Per layer type, as in the real checkpoints: local layers keep theta 10k, global
                # layers use theta 1M with linear scaling 8.
                "rope_parameters": {
                    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
                    FULL: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
                },
                "hidden_activation": "gelu_pytorch_tanh",
                "rms_norm_eps": 1e-6,
                "attn_logit_softcapping": None,
                "final_logit_softcapping": None,
                "max_position_embeddings": 32768,
                "use_bidirectional_attention": False,
                "attention_bias": False,
                "attention_dropout": 0.0,
                "initializer_range": self.init_std,
                "pad_token_id": PAD_ID,
                "eos_token_id": [EOS_ID, END_OF_TURN_ID],
                "bos_token_id": BOS_ID,
                "tie_word_embeddings": True,
                "dtype": "float32",
            },
            "vision_config": self._vision_config_dict(),
        }

    def _vision_config_dict(self) -> dict:
        return {
            "model_type": "siglip_vision_model",
            "hidden_size": self.vision_hidden,
            "intermediate_size": self.vision_intermediate,
            "num_hidden_layers": self.vision_layers,
            "num_attention_heads": self.vision_heads,
            "num_channels": 3,
            "image_size": self.vision_image_size,
            "patch_size": self.vision_patch_size,
            "hidden_act": "gelu_pytorch_tanh",
            "layer_norm_eps": 1e-6,
            "attention_dropout": 0.0,
            # Gemma3 uses SigLIP's patch embeddings, not its pooled head.
            "vision_use_head": False,
            "dtype": "float32",
        }


# Init std 0.3, as for the Qwen2-VL built-ins: with the usual 0.02 a random model emits one token
# whatever its input (the embedding table is then rescaled, see _cancel_embedding_scale). Norm
# weights are filled with ones, which Gemma's RMSNorm (x * (1 + w)) reads as gain 2: harmless,
# every sublayer output is normalized anyway, and outputs still depend on the input (tested).
BUILTIN_SPECS: dict[str, Gemma3Spec] = {
    # For tests: builds in seconds. A 32-token window is shorter than an image (64 tokens), so
    # sliding-window masking is exercised by every image request.
    "gemma3-tiny": Gemma3Spec(
        name="gemma3-tiny",
        seed=20261201,
        init_std=0.3,
        text_hidden=64,
        text_layer_types=(SLIDING, SLIDING, SLIDING, FULL),
        text_heads=2,
        text_kv_heads=1,
        text_head_dim=32,
        query_pre_attn_scalar=32,
        text_intermediate=256,
        sliding_window=32,
        vision_image_size=224,
        vision_patch_size=14,
        vision_hidden=64,
        vision_layers=2,
        vision_heads=2,
        vision_intermediate=256,
        mm_tokens_per_image=64,  # 16x16 patches pooled 2x2 -> 8x8
    ),
    # For benchmarks: Gemma3's real head_dim 256 and 5:1 local:global layer pattern.
    "gemma3-small": Gemma3Spec(
        name="gemma3-small",
        seed=20261202,
        init_std=0.3,
        text_hidden=768,
        text_layer_types=(SLIDING,) * 5 + (FULL,),
        text_heads=3,
        text_kv_heads=1,
        text_head_dim=256,
        query_pre_attn_scalar=256,
        text_intermediate=2048,
        sliding_window=512,
        vision_image_size=448,
        vision_patch_size=14,
        vision_hidden=512,
        vision_layers=6,
        vision_heads=8,
        vision_intermediate=2048,
        mm_tokens_per_image=256,  # 32x32 patches pooled 2x2 -> 16x16
    ),
}


def build_image_processor(spec: Gemma3Spec):
    """Gemma3's PIL image processor (no torchvision needed) at the spec's square input size."""
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    return Gemma3ImageProcessorPil(
        size={"height": spec.vision_image_size, "width": spec.vision_image_size},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        rescale_factor=1 / 255,
        do_pan_and_scan=False,
        # The real checkpoints' pan-and-scan settings, used only if a request turns it on.
        pan_and_scan_min_crop_size=256,
        pan_and_scan_max_num_crops=4,
        pan_and_scan_min_ratio_to_activate=1.2,
    )


def _cancel_embedding_scale(model: torch.nn.Module, spec: Gemma3Spec) -> None:
    """Shrink the (tied) token embedding table by sqrt(hidden_size), which Gemma multiplies back in.

    Gemma scales input embeddings by sqrt(hidden_size). On a std-0.3 table that makes the current
    token's embedding dominate the residual stream, and through the tied unembedding each token
    then predicts itself: greedy decoding locks onto one id (docs/benchmarks.md, "Measurements
    behind code comments"), so the reply stops depending
    on the context and a broken KV cache or sliding window would go unnoticed. Cancelling the
    scale gives the residual stream the same N(0, std) input as the Qwen2-VL built-ins. Image soft
    tokens bypass Gemma's scaling, so the projector is left as filled. Side effect: logits are
    sqrt(hidden_size) smaller (std about 0.6), which does not change greedy choices.
    """
    import torch

    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(1.0 / math.sqrt(spec.text_hidden))


def _use_hub_vision_names(weights_file: Path) -> None:
    """Rename "vision_tower.X" to the Hub's "vision_tower.vision_model.X". transformers 5 saves its
    SigLIP without the "vision_model" level (and reads both); the Hub's Gemma3 checkpoints, and vLLM,
    expect it."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(weights_file), framework="pt") as handle:
        metadata = handle.metadata()
        tensors = {
            (
                "vision_tower.vision_model." + name.removeprefix("vision_tower.") if name.startswith("vision_tower.") else name
            ): handle.get_tensor(name)
            for name in handle.keys()
        }
    save_file(tensors, str(weights_file), metadata=metadata)


def write_checkpoint(spec: Gemma3Spec, out: Path, progress: ProgressFn) -> int:
    """Write checkpoint ``spec`` into the existing, empty directory ``out``. Returns the parameter count."""
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, GenerationConfig

    from services.models.builtins.gemma3_tokenizer import build_gemma3_tokenizer
    from services.models.builtins.weights import fill_deterministic

    out = Path(out)
    progress(f"[{spec.name}] 1/4 config")
    config = Gemma3Config(**spec.config_dict())
    progress(f"[{spec.name}] 2/4 weights (seed {spec.seed}, std {spec.init_std})")
    torch.manual_seed(spec.seed)  # only construction-time init; every parameter is overwritten next
    model = Gemma3ForConditionalGeneration(config).to(torch.float32).eval()
    fill_deterministic(model, seed=spec.seed, std=spec.init_std)
    _cancel_embedding_scale(model, spec)
    num_params = sum(p.numel() for p in model.parameters())
    progress(f"[{spec.name}] 3/4 saving {num_params / 1e6:.1f}M parameters")
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_ID,
        eos_token_id=[EOS_ID, END_OF_TURN_ID],
        pad_token_id=PAD_ID,
        do_sample=False,
    )
    model.save_pretrained(out, safe_serialization=True)
    _use_hub_vision_names(out / "model.safetensors")
    progress(f"[{spec.name}] 4/4 tokenizer, image processor, chat template")
    build_gemma3_tokenizer().save_pretrained(out)
    build_image_processor(spec).save_pretrained(out)
    # As in the real checkpoints: without it AutoProcessor falls back to Gemma3Processor's default
    # of 256 image tokens, which disagrees with a model pooling to any other count.
    processor_config = {"image_seq_length": spec.mm_tokens_per_image, "processor_class": "Gemma3Processor"}
    (out / "processor_config.json").write_text(json.dumps(processor_config, indent=2, sort_keys=True) + "\n")
    return num_params
