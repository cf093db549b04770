"""A PEFT adapter directory's files and their fingerprint, without reading a tensor: what the
gateway needs of an adapter (it names it by fingerprint and never loads torch) and what a node
checks its own copy against (services/models/lora/adapter.py reads the tensors). An adapter is a
local directory or, as vLLM takes it, a Hub id (``org/name[@revision]``), fetched through the
checkpoints' Hub path (services/models/hub.py: its cache, HF_TOKEN, HF_ENDPOINT, HF_HUB_OFFLINE)."""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from pathlib import Path

from services.models.fingerprint import files_fingerprint
from services.models.hub import HubModelError, download, parse_hub_reference

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# PEFT's tensor names: "base_model.model.<module>.lora_A.weight" (or ".lora_A.<adapter>.weight").
PEFT_PREFIX = "base_model.model."
PEFT_TENSOR = re.compile(r"^(?P<module>.+)\.lora_(?P<part>[AB])(?:\.[^.]+)?\.weight$")
MAX_HEADER_BYTES = 64 << 20  # a safetensors header past this is not an adapter's


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


def touches_tower(path: Path, weight_group: Callable[[str], tuple[str, str] | None]) -> bool:
    """Whether the adapter in ``path`` changes any module ``weight_group`` puts on the vision
    side (tower or projector), read from its safetensors header alone (no tensor, no torch):
    LoraRef.tower, which keys its image embeddings apart. A node reading the tensors comes to
    the same answer (LoraAdapter.touches_tower) and refuses a request that says otherwise."""
    file = path / WEIGHTS_FILE
    try:
        with open(file, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            if size > MAX_HEADER_BYTES:
                raise ValueError(f"header of {size} bytes")
            names = json.loads(handle.read(size))
    except (OSError, ValueError, struct.error) as exc:
        raise LoraAdapterError(f"{file} is not a readable safetensors file: {exc}") from None
    for key in names:
        match = PEFT_TENSOR.match(key.removeprefix(PEFT_PREFIX))
        if match is not None and (weight_group(match["module"] + ".weight") or ("",))[0] == "vision":
            return True
    return False
