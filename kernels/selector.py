"""The one place that picks an attention backend. attention.py holds the interface the backends
implement; the backends import it, and only this module imports the backends (no cycle)."""

from __future__ import annotations

import torch

from kernels.attention import AttentionBackend
from kernels.flashinfer_backend import FlashInferBackend, flashinfer_available
from kernels.torch_backend import TorchReferenceBackend


def available_backends() -> list[str]:
    names = ["torch"]
    if flashinfer_available():
        names.append("flashinfer")
    return names


def create_backend(name: str, device: torch.device, *, needs_masks: bool = False) -> AttentionBackend:
    """``auto`` picks flashinfer on CUDA when it imports, else the PyTorch reference.
    ``needs_masks``: the model uses sliding windows or bidirectional image spans, which only the
    PyTorch reference implements; ``auto`` then picks it, and naming flashinfer is an error."""
    if name == "auto":
        name = "flashinfer" if device.type == "cuda" and flashinfer_available() and not needs_masks else "torch"
    if name == "torch":
        return TorchReferenceBackend()
    if name == "flashinfer":
        if device.type != "cuda" or not flashinfer_available():
            raise ValueError("the flashinfer backend needs CUDA and the flashinfer package")
        if needs_masks:
            raise ValueError("this model needs sliding-window or image-span attention, which the flashinfer backend lacks; use torch")
        return FlashInferBackend(device)
    raise ValueError(f"unknown attention backend {name!r}; choose auto, torch or flashinfer")
