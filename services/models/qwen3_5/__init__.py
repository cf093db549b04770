"""Qwen3.5: Qwen3-VL's vision tower without DeepStack, and a hybrid text decoder in which three of
every four layers are Gated DeltaNet linear attention, keeping a fixed-size state per request
instead of KV, and every fourth is gated full attention with a partial, interleaved M-RoPE.

``qwen3_5_moe`` is the same with a mixture of experts in place of each layer's MLP.

Processors, placeholders and positions are Qwen3-VL's, as transformers' (Qwen3VLProcessor, the
Qwen2-VL image processor, the Qwen3-VL video processor and get_rope_index).
"""

from __future__ import annotations

from services.models.builtins.qwen3_5 import BUILTIN_SPECS
from services.models.family import FamilyInfo

INFO = FamilyInfo(
    name="qwen3_5",
    model_types=("qwen3_5", "qwen3_5_moe"),
    builtin_names=tuple(BUILTIN_SPECS),
    tool_call_parser="hermes",
    module="services.models.qwen3_5.family",
    names_module="services.models.qwen3_5.config",
)
