"""A PEFT adapter directory's files and their fingerprint, without reading a tensor: what the
gateway needs of an adapter (it names it by fingerprint and never loads torch) and what a node
checks its own copy against (services/models/lora/adapter.py reads the tensors)."""

from __future__ import annotations

from pathlib import Path

from services.models.fingerprint import files_fingerprint

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


class LoraAdapterError(ValueError):
    """An adapter that cannot be served; the message says why."""


def adapter_fingerprint(path: Path) -> str:
    """The fingerprint of the adapter in ``path`` (of its two files): what a gateway names a
    request's adapter by, and what a node checks its own copy against."""
    for file in (path / CONFIG_FILE, path / WEIGHTS_FILE):
        if not file.is_file():
            raise LoraAdapterError(f"no {file.name} in {path}: not a PEFT adapter directory with safetensors weights")
    return files_fingerprint([path / CONFIG_FILE, path / WEIGHTS_FILE])
