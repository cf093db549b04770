"""A PEFT adapter directory's files and their fingerprint, without reading a tensor: what the
gateway needs of an adapter (it names it by fingerprint and never loads torch) and what a node
checks its own copy against (services/models/lora/adapter.py reads the tensors). An adapter is a
local directory or, as vLLM takes it, a Hub id (``org/name[@revision]``), fetched through the
checkpoints' Hub path (services/models/hub.py: its cache, HF_TOKEN, HF_ENDPOINT, HF_HUB_OFFLINE)."""

from __future__ import annotations

from pathlib import Path

from services.models.fingerprint import files_fingerprint
from services.models.hub import HubModelError, download, parse_hub_reference

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


class LoraAdapterError(ValueError):
    """An adapter that cannot be served; the message says why."""


def adapter_directory(reference: str | Path) -> Path:
    """The local directory of an adapter named by a path or a Hub id (downloaded, or from the
    cache); raises LoraAdapterError saying what is wrong."""
    path = Path(reference).expanduser()
    if path.is_dir():
        return path
    hub = parse_hub_reference(str(reference))
    if hub is None:
        raise LoraAdapterError(f"LoRA adapter {str(reference)!r} is neither a directory nor a Hub id (org/name)")
    try:
        return download(hub)
    except HubModelError as exc:
        raise LoraAdapterError(f"LoRA adapter {hub}: {exc}") from None


def adapter_fingerprint(path: Path) -> str:
    """The fingerprint of the adapter in ``path`` (of its two files): what a gateway names a
    request's adapter by, and what a node checks its own copy against."""
    for file in (path / CONFIG_FILE, path / WEIGHTS_FILE):
        if not file.is_file():
            raise LoraAdapterError(f"no {file.name} in {path}: not a PEFT adapter directory with safetensors weights")
    return files_fingerprint([path / CONFIG_FILE, path / WEIGHTS_FILE])
