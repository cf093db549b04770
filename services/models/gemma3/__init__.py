"""Gemma3: a SigLIP tower on square views, an AvgPool projector to soft tokens, optional
Pan-and-Scan crops, 1-D positions, interleaved sliding-window and global text layers, and
bidirectional attention among the tokens of one image."""

from __future__ import annotations

from services.models.builtins.gemma3 import BUILTIN_SPECS
from services.models.family import FamilyInfo

INFO = FamilyInfo(
    name="gemma3",
    model_types=("gemma3",),
    builtin_names=tuple(BUILTIN_SPECS),
    tool_call_parser=None,
    module="services.models.gemma3.family",
    names_module="services.models.gemma3.config",
)
