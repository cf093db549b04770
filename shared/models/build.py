"""``tessera models build``: write a complete, byte-reproducible Qwen2-VL checkpoint directory.

Steps: config -> deterministic weights -> safetensors -> tokenizer + image processor + template.
The directory is assembled under a temporary name and renamed into place, so a half-built model
is never visible to a concurrent reader.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from shared.models.specs import BUILTIN_SPECS, BuiltinSpec
from shared.models.tokens import ENDOFTEXT_ID, IM_END_ID, MAX_PIXELS, MIN_PIXELS

ProgressFn = Callable[[str], None]

# Written into the directory last; its presence marks a complete build.
BUILD_STAMP = "tessera_build.json"
BUILD_FORMAT = 1


def _noop(_: str) -> None:
    pass


def build_builtin(name: str, out_dir: Path, *, progress: ProgressFn = _noop) -> Path:
    """Build built-in model ``name`` into ``out_dir`` (replaced if it exists). Returns ``out_dir``."""
    if name not in BUILTIN_SPECS:
        raise ValueError(f"unknown built-in model {name!r}; choose one of {sorted(BUILTIN_SPECS)}")
    spec = BUILTIN_SPECS[name]
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        _write_checkpoint(spec, staging, progress)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    progress(f"[{name}] done: {out_dir}")
    return out_dir


def is_complete_build(path: Path) -> bool:
    stamp = Path(path) / BUILD_STAMP
    if not stamp.is_file():
        return False
    try:
        return json.loads(stamp.read_text()).get("format") == BUILD_FORMAT
    except (OSError, json.JSONDecodeError):
        return False


def _write_checkpoint(spec: BuiltinSpec, out: Path, progress: ProgressFn) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2VLConfig, Qwen2VLForConditionalGeneration

    from shared.models.weights import fill_deterministic

    progress(f"[{spec.name}] 1/4 config")
    config = Qwen2VLConfig(**spec.config_dict())
    config.dtype = "float32"
    progress(f"[{spec.name}] 2/4 weights (seed {spec.seed}, std {spec.init_std})")
    torch.manual_seed(spec.seed)  # only construction-time init; every tensor is overwritten next
    model = Qwen2VLForConditionalGeneration(config).to(torch.float32).eval()
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
    tokenizer, image_processor = build_processor_parts()
    tokenizer.save_pretrained(out)
    image_processor.save_pretrained(out)
    (out / BUILD_STAMP).write_text(
        json.dumps({"format": BUILD_FORMAT, "name": spec.name, "seed": spec.seed, "num_params": num_params}) + "\n"
    )


def build_processor_parts():
    """Qwen2-VL's tokenizer (with chat template) and PIL image processor with its real pixel limits.

    Saved as separate parts: transformers' combined processor insists on a torchvision video
    processor, and torchvision cannot be installed here.
    """
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from shared.models.tokenizer_build import build_qwen2_tokenizer

    image_processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
    )
    return build_qwen2_tokenizer(), image_processor
