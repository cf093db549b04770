"""Qwen2-VL and Qwen2.5-VL: a patch-merging vision tower (transformers' own modules), M-RoPE, and
one ``<|image_pad|>`` marker per image expanded at the token level."""

from __future__ import annotations

from services.models.builtins.qwen2_vl import BUILTIN_SPECS
from services.models.family import FamilyInfo

INFO = FamilyInfo(
    name="qwen2_vl",
    model_types=("qwen2_vl", "qwen2_5_vl"),
    builtin_names=tuple(BUILTIN_SPECS),
    tool_call_parser="hermes",
    module="services.models.qwen2_vl.family",
    names_module="services.models.qwen2_vl.config",
)
