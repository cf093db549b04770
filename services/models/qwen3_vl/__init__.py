"""Qwen3-VL: a 16-pixel-patch vision tower with DeepStack levels (transformers' own modules),
Qwen3 text layers with interleaved M-RoPE, and one ``<|image_pad|>`` marker per image expanded at
the token level, as Qwen2-VL.

Shared with Qwen2-VL, because transformers does the same there: the image processor class
(Qwen3VLProcessor uses Qwen2-VL's, with patch size 16), token-level placeholder expansion, and the
M-RoPE position layout of images (Qwen3-VL's get_rope_index differs only for videos, which split
into per-frame grids). What differs is the decoder (q/k norms, interleaved frequencies, DeepStack)
and the tower.
"""

from __future__ import annotations

from services.models.builtins.qwen3_vl import BUILTIN_SPECS
from services.models.family import FamilyInfo

INFO = FamilyInfo(
    name="qwen3_vl",
    model_types=("qwen3_vl",),
    builtin_names=tuple(BUILTIN_SPECS),
    tool_call_parser="hermes",
    module="services.models.qwen3_vl.family",
    names_module="services.models.qwen3_vl.config",
)
