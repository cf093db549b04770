"""The sampling defaults a checkpoint ships in ``generation_config.json``, applied where a request
leaves a field unset, as vLLM does under its default ``--generation-config auto``.

Which fields: vLLM's (``repetition_penalty``, ``temperature``, ``top_k``, ``top_p``, ``min_p``), each
only where the file's value differs from transformers' ``GenerationConfig`` default, as vLLM takes
``to_diff_dict()``. Transformers' ``generate`` applies the same values, so a greedy request against
a checkpoint whose file sets ``repetition_penalty`` (Qwen2-VL-7B-Instruct's 1.05) is penalised in
both. ``max_new_tokens`` is not taken: the gateway's ``default_max_tokens`` and the context fit
decide a request's length.

Read as JSON, not through transformers: the gateway, which applies them, loads no model library.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

# transformers' GenerationConfig defaults for these fields: a value equal to one is no default of
# the checkpoint's own (vLLM's to_diff_dict rule).
TRANSFORMERS_DEFAULTS: dict[str, float | None] = {
    "repetition_penalty": 1.0,
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
    "min_p": None,
}
GENERATION_CONFIG_MODES = ("auto", "vllm")  # vLLM's spellings: the model's defaults, or none


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    repetition_penalty: float | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None

    def as_dict(self) -> dict[str, float | int]:
        """The fields the checkpoint sets, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


NO_DEFAULTS = SamplingDefaults()


def read_sampling_defaults(model_dir: Path, mode: str = "auto") -> SamplingDefaults:
    """The checkpoint's defaults under ``mode`` ("auto": its generation_config.json's; "vllm":
    none); a missing or unreadable file has none."""
    if mode not in GENERATION_CONFIG_MODES:
        raise ValueError(f"generation_config must be one of {', '.join(GENERATION_CONFIG_MODES)}, got {mode!r}")
    path = model_dir / "generation_config.json"
    if mode == "vllm" or not path.is_file():
        return NO_DEFAULTS
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return NO_DEFAULTS
    values = {}
    for name, transformers_default in TRANSFORMERS_DEFAULTS.items():
        value = raw.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float) or value == transformers_default:
            continue
        values[name] = int(value) if name == "top_k" else float(value)
    return SamplingDefaults(**values)
