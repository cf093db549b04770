"""The KV page wire format, in one place: how a run of KV blocks travels between nodes (prefill to
decode after a prompt, any peer to a puller for a cached prefix).

Format ``tessera-kv-pages/1``: one tensor message (services/transport/tensor_channel.py) whose
tensors are ``k{layer}`` and ``v{layer}`` for every layer, each shaped (num_blocks, block_size,
num_kv_heads, head_dim) in the sender's KV dtype, and whose metadata names the format, the layer
count and the block count. A receiver refuses another format or shape rather than filing pages
it would misread. Bump the version on any change to the layout. A sliding-window layer's page
that no query after the run can read may travel as zeros; both ends apply the same window rule
(kv/layout.py), and the receiver never files it.
"""

from __future__ import annotations

import torch

PAGE_FORMAT = "tessera-kv-pages/1"
# Per layer (K pages, V pages), each (num_blocks, block_size, num_kv_heads, head_dim).
KVPages = list[tuple[torch.Tensor, torch.Tensor]]


class PageFormatError(ValueError):
    """Pages that do not match this node's format or model."""


def num_blocks(pages: KVPages) -> int:
    return pages[0][0].shape[0] if pages else 0


def pack(pages: KVPages) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, metadata) of a tensor message carrying ``pages``."""
    tensors: dict[str, torch.Tensor] = {}
    for layer, (k, v) in enumerate(pages):
        tensors[f"k{layer}"] = k
        tensors[f"v{layer}"] = v
    return tensors, {"format": PAGE_FORMAT, "num_layers": len(pages), "num_blocks": num_blocks(pages)}


def unpack(tensors: dict[str, torch.Tensor], meta: dict, num_layers: int) -> KVPages:
    if meta.get("format") != PAGE_FORMAT:
        raise PageFormatError(f"KV pages in format {meta.get('format')!r}; this node reads {PAGE_FORMAT!r}")
    if meta.get("num_layers") != num_layers:
        raise PageFormatError(f"KV pages for {meta.get('num_layers')} layers; this model has {num_layers}")
    try:
        pages = [(tensors[f"k{i}"], tensors[f"v{i}"]) for i in range(num_layers)]
    except KeyError as exc:
        raise PageFormatError(f"KV pages lack tensor {exc.args[0]}") from None
    if any(k.shape != v.shape or k.shape[0] != meta.get("num_blocks") for k, v in pages):
        raise PageFormatError("KV pages disagree with their block count or between K and V")
    return pages
