"""Make a vLLM-ready copy of a Tessera checkpoint directory, for any model family.

Run with the vLLM venv's python (its transformers has the video processors vLLM insists on):
    python benchmarks/peers/prepare_model.py SRC_MODEL_DIR DST_DIR

vLLM loads a model's combined processor. Our Qwen built-ins ship the tokenizer and image processor
as separate parts (transformers' combined Qwen processors need a torchvision video processor,
which our own environment cannot install), so this saves the combined one. Gemma3 built-ins
already carry processor_config.json: they are copied as they are.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path


def _save_qwen_processor(directory: Path, model_type: str) -> None:
    from transformers import AutoTokenizer, Qwen2VLImageProcessor

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    image_processor = Qwen2VLImageProcessor.from_pretrained(str(directory))
    if model_type in ("qwen3_vl", "qwen3_5", "qwen3_5_moe"):  # transformers' Qwen3VLProcessor serves all three
        from transformers import Qwen3VLProcessor as Processor
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor as VideoProcessor
    else:
        from transformers import Qwen2VLProcessor as Processor
        from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor as VideoProcessor
    video_processor = VideoProcessor()
    Processor(image_processor, tokenizer, video_processor, chat_template=tokenizer.chat_template).save_pretrained(str(directory))


def prepare(source: Path, destination: Path) -> Path:
    if destination.exists():
        shutil.rmtree(destination)
    shutil.copytree(source, destination)
    model_type = json.loads((destination / "config.json").read_text())["model_type"]
    if model_type in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "qwen3_5_moe"):
        _save_qwen_processor(destination, model_type)
    elif model_type != "gemma3":
        raise SystemExit(f"no vLLM preparation for model type {model_type!r}")
    return destination


if __name__ == "__main__":
    print(prepare(Path(sys.argv[1]), Path(sys.argv[2])))
