"""The built-in Qwen3-VL models (``qwen3vl-tiny``, ``qwen3vl-small``) and how their checkpoints are
written.

Both are real Qwen3-VL architectures with small dimensions: Qwen3 text layers (q/k norms, no qkv
bias), interleaved M-RoPE whose (t, h, w) sections keep Qwen3-VL's 24/20/20 proportions, a vision
tower of 16-pixel patches with learned, interpolated position embeddings, and DeepStack levels
feeding the first decoder layers. Tokenizer, special-token ids and vocabulary are Qwen2-VL's (the
same in Qwen3-VL); the chat template, image-processor limits and normalisation are Qwen3-VL's.
Weights come from ``fill_deterministic`` (values depend only on seed, parameter name and shape):
two builds are byte-identical.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.models.builtins.qwen2_tokens import IMAGE_PAD_ID, SPECIAL_TOKEN_TO_ID, VISION_END_ID, VISION_START_ID, VOCAB_SIZE
from services.models.builtins.qwen2_vl import write_qwen_checkpoint
from services.models.family import ProgressFn

# Qwen3-VL's image processor: 256x256 to 4096x4096 pixels, normalised to [-1, 1].
MIN_PIXELS = 256 * 256
MAX_PIXELS = 4096 * 4096
PATCH_SIZE = 16


@dataclass(frozen=True, slots=True)
class BuiltinSpec:
    name: str
    seed: int
    init_std: float
    text_hidden: int
    text_layers: int
    text_heads: int
    text_kv_heads: int
    text_head_dim: int
    text_intermediate: int
    mrope_section: tuple[int, int, int]
    vision_hidden: int
    vision_depth: int
    vision_heads: int
    vision_intermediate: int
    deepstack_visual_indexes: tuple[int, ...]

    def __post_init__(self) -> None:
        if sum(self.mrope_section) != self.text_head_dim // 2:
            raise ValueError(f"{self.name}: mrope_section {self.mrope_section} must sum to head_dim/2 = {self.text_head_dim // 2}")
        if any(not 0 <= i < self.vision_depth for i in self.deepstack_visual_indexes):
            raise ValueError(f"{self.name}: DeepStack indexes {self.deepstack_visual_indexes} outside {self.vision_depth} vision blocks")
        if len(self.deepstack_visual_indexes) > self.text_layers:
            raise ValueError(f"{self.name}: more DeepStack levels than decoder layers")

    def config_dict(self) -> dict:
        """A Qwen3-VL ``config.json`` body for this spec (transformers 5's form)."""
        return {
            "architectures": ["Qwen3VLForConditionalGeneration"],
            "model_type": "qwen3_vl",
            "image_token_id": IMAGE_PAD_ID,
            "video_token_id": SPECIAL_TOKEN_TO_ID["<|video_pad|>"],
            "vision_start_token_id": VISION_START_ID,
            "vision_end_token_id": VISION_END_ID,
            # As Qwen3-VL-2B/4B: the LM head is the embedding table.
            "tie_word_embeddings": True,
            "text_config": {
                "model_type": "qwen3_vl_text",
                "vocab_size": VOCAB_SIZE,
                "hidden_size": self.text_hidden,
                "intermediate_size": self.text_intermediate,
                "num_hidden_layers": self.text_layers,
                "num_attention_heads": self.text_heads,
                "num_key_value_heads": self.text_kv_heads,
                "head_dim": self.text_head_dim,
                "hidden_act": "silu",
                "max_position_embeddings": 262144,
                "rms_norm_eps": 1e-6,
                "attention_bias": False,
                "initializer_range": self.init_std,
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 5_000_000.0,
                    "mrope_section": list(self.mrope_section),
                    "mrope_interleaved": True,
                },
            },
            "vision_config": {
                "model_type": "qwen3_vl_vision",
                "depth": self.vision_depth,
                "hidden_size": self.vision_hidden,
                "intermediate_size": self.vision_intermediate,
                "num_heads": self.vision_heads,
                "hidden_act": "gelu_pytorch_tanh",
                "in_channels": 3,
                "patch_size": PATCH_SIZE,
                "spatial_merge_size": 2,
                "temporal_patch_size": 2,
                "out_hidden_size": self.text_hidden,
                "num_position_embeddings": 2304,  # a learned 48x48 grid, as in every Qwen3-VL
                "deepstack_visual_indexes": list(self.deepstack_visual_indexes),
                "initializer_range": self.init_std,
            },
        }


# Init std 0.3, as for the other built-ins: with the usual 0.02 a random model emits one token
# whatever its input, which would let a broken pipeline pass the oracle (tests check it does not).
BUILTIN_SPECS: dict[str, BuiltinSpec] = {
    # For tests: builds in seconds. Two DeepStack levels, on the first two of four decoder layers.
    "qwen3vl-tiny": BuiltinSpec(
        name="qwen3vl-tiny",
        seed=20261211,
        init_std=0.3,
        text_hidden=64,
        text_layers=4,
        text_heads=2,
        text_kv_heads=1,
        text_head_dim=32,
        text_intermediate=256,
        mrope_section=(6, 5, 5),
        vision_hidden=64,
        vision_depth=3,
        vision_heads=2,
        vision_intermediate=256,
        deepstack_visual_indexes=(0, 1),
    ),
    # For benchmarks: Qwen3-VL's 24/20/20 sections halved for head_dim 64, three DeepStack levels.
    "qwen3vl-small": BuiltinSpec(
        name="qwen3vl-small",
        seed=20261212,
        init_std=0.3,
        text_hidden=768,
        text_layers=6,
        text_heads=12,
        text_kv_heads=2,
        text_head_dim=64,
        text_intermediate=2048,
        mrope_section=(12, 10, 10),
        vision_hidden=512,
        vision_depth=6,
        vision_heads=8,
        vision_intermediate=2048,
        deepstack_visual_indexes=(1, 3, 5),
    ),
}


def build_processor_parts():
    """The Qwen2 tokenizer with Qwen3-VL's chat template, and Qwen3-VL's image processor settings on
    transformers' PIL backend (Qwen3VLProcessor uses Qwen2-VL's image processor class). Saved as
    separate parts: transformers' combined processor insists on a torchvision video processor."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from services.models.builtins.qwen2_tokenizer import build_qwen2_tokenizer
    from services.models.builtins.qwen3_vl_template import CHAT_TEMPLATE

    tokenizer = build_qwen2_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    image_processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
        patch_size=PATCH_SIZE,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    return tokenizer, image_processor


def write_checkpoint(spec: BuiltinSpec, out: Path, progress: ProgressFn) -> int:
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    return write_qwen_checkpoint(spec, out, progress, Qwen3VLConfig, Qwen3VLForConditionalGeneration, build_processor_parts)
