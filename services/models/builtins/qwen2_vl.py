"""The built-in Qwen2-VL models (``tiny``, ``small``) and how their checkpoints are written.

Both are real Qwen2-VL architectures with small dimensions. Text head_dim is 64 in both so the
M-RoPE sections keep Qwen2-VL's 16/24/24 proportions (scaled to 8/12/12).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.models.builtins.qwen2_tokens import ENDOFTEXT_ID, IM_END_ID, MAX_PIXELS, MIN_PIXELS, VOCAB_SIZE
from services.models.family import ProgressFn


@dataclass(frozen=True, slots=True)
class BuiltinSpec:
    name: str
    seed: int
    init_std: float
    text_hidden: int
    text_layers: int
    text_heads: int
    text_kv_heads: int
    text_intermediate: int
    vision_embed_dim: int
    vision_depth: int
    vision_heads: int
    mrope_section: tuple[int, int, int]

    def config_dict(self) -> dict:
        """A Qwen2-VL ``config.json`` body for this spec."""
        return {
            "architectures": ["Qwen2VLForConditionalGeneration"],
            "model_type": "qwen2_vl",
            "image_token_id": 151655,
            "video_token_id": 151656,
            "vision_start_token_id": 151652,
            "vision_end_token_id": 151653,
            "tie_word_embeddings": True,
            "text_config": {
                "model_type": "qwen2_vl_text",
                "vocab_size": VOCAB_SIZE,
                "hidden_size": self.text_hidden,
                "intermediate_size": self.text_intermediate,
                "num_hidden_layers": self.text_layers,
                "num_attention_heads": self.text_heads,
                "num_key_value_heads": self.text_kv_heads,
                "hidden_act": "silu",
                "max_position_embeddings": 32768,
                "rms_norm_eps": 1e-6,
                "initializer_range": self.init_std,
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 1000000.0,
                    "mrope_section": list(self.mrope_section),
                },
                "bos_token_id": 151643,
                "eos_token_id": 151645,
                "tie_word_embeddings": True,
            },
            "vision_config": {
                "model_type": "qwen2_vl_vision",
                "depth": self.vision_depth,
                "embed_dim": self.vision_embed_dim,
                "hidden_size": self.text_hidden,
                "hidden_act": "quick_gelu",
                "mlp_ratio": 4,
                "num_heads": self.vision_heads,
                "in_channels": 3,
                "patch_size": 14,
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
                "initializer_range": self.init_std,
            },
        }


# Init std 0.3: with the usual 0.02 a random model emits one token whatever its input, which
# would let a broken pipeline pass the oracle. 0.3 makes outputs depend on the input.
BUILTIN_SPECS: dict[str, BuiltinSpec] = {
    "tiny": BuiltinSpec(
        name="tiny",
        seed=20261121,
        init_std=0.3,
        text_hidden=64,
        text_layers=4,
        text_heads=1,
        text_kv_heads=1,
        text_intermediate=256,
        vision_embed_dim=64,
        vision_depth=2,
        vision_heads=2,
        mrope_section=(8, 12, 12),
    ),
    "small": BuiltinSpec(
        name="small",
        seed=20261122,
        init_std=0.3,
        text_hidden=768,
        text_layers=6,
        text_heads=12,
        text_kv_heads=2,
        text_intermediate=2048,
        vision_embed_dim=512,
        vision_depth=6,
        vision_heads=8,
        mrope_section=(8, 12, 12),
    ),
}


def write_checkpoint(spec: BuiltinSpec, out: Path, progress: ProgressFn) -> int:
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    return write_qwen_checkpoint(spec, out, progress, Qwen2VLConfig, Qwen2VLForConditionalGeneration, build_processor_parts)


def write_qwen_checkpoint(spec, out: Path, progress: ProgressFn, config_cls, model_cls, processor_parts) -> int:
    """Config -> deterministic weights -> safetensors -> tokenizer + image processor + template,
    for any Qwen-VL generation (``spec`` has name, seed, init_std and config_dict())."""
    import torch
    from transformers import GenerationConfig

    from services.models.builtins.weights import fill_deterministic

    progress(f"[{spec.name}] 1/4 config")
    config = config_cls(**spec.config_dict())
    config.dtype = "float32"
    progress(f"[{spec.name}] 2/4 weights (seed {spec.seed}, std {spec.init_std})")
    torch.manual_seed(spec.seed)  # only construction-time init; every tensor is overwritten next
    model = model_cls(config).to(torch.float32).eval()
    fill_deterministic(model, seed=spec.seed, std=spec.init_std)
    num_params = sum(p.numel() for p in model.parameters())
    progress(f"[{spec.name}] 3/4 saving {num_params / 1e6:.1f}M parameters")
    model.generation_config = GenerationConfig(
        bos_token_id=ENDOFTEXT_ID,
        eos_token_id=[IM_END_ID, ENDOFTEXT_ID],
        pad_token_id=ENDOFTEXT_ID,
        do_sample=False,
    )
    model.save_pretrained(out, safe_serialization=True)
    progress(f"[{spec.name}] 4/4 tokenizer, image processor, chat template")
    tokenizer, image_processor = processor_parts()
    tokenizer.save_pretrained(out)
    image_processor.save_pretrained(out)
    return num_params


def build_processor_parts():
    """Qwen2-VL's tokenizer (with chat template) and PIL image processor with its real pixel limits.

    Saved as separate parts: transformers' combined processor insists on a torchvision video
    processor, and torchvision cannot be installed here.
    """
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from services.models.builtins.qwen2_tokenizer import build_qwen2_tokenizer

    image_processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
    )
    return build_qwen2_tokenizer(), image_processor
