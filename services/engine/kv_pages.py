"""The KV page wire format, in one place: how a run of KV blocks travels between nodes (prefill to
decode after a prompt, any peer to a puller for a cached prefix).

Format ``tessera-kv-pages/2``: one tensor message (services/transport/tensor_channel.py) whose
tensors are ``k{i}`` and ``v{i}`` for the i-th layer that keeps KV, each shaped (num_blocks,
block_size, num_kv_heads, head_dim) in the sender's KV dtype, and, for a hybrid model's request,
``conv{j}`` and ``state{j}`` for its j-th state layer: the request's state after the tokens whose
KV the pages hold (kv/recurrent_state.py), and ``prefix_conv{j}`` and ``prefix_state{j}``: its
state saved at the end of block ``prefix_blocks``, which lets the receiver serve prefix hits on
the pages. The metadata names the format, the KV layer count, the state layer count, the block
count and ``prefix_blocks`` (0: no saved state travels). A receiver refuses another format or shape rather than
filing pages it would misread. Bump the version on any change to the layout. A sliding-window
layer's page that no query after the run can read may travel as zeros; both ends apply the same
window rule (kv/layout.py), and the receiver never files it. A cached prefix travels without
state (a prefix hit is not served to a hybrid model).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

PAGE_FORMAT = "tessera-kv-pages/2"


@dataclass(slots=True)
class KVPages:
    # Per layer that keeps KV, in order: (K pages, V pages), each (num_blocks, block_size, num_kv_heads, head_dim).
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    # Per state layer, in order, one request's: (conv inputs (conv_dim, width), recurrent (heads, key_dim, value_dim)).
    states: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    # A hybrid request's state saved after its first ``prefix_blocks`` blocks, so that the
    # receiver can serve prefix hits on these pages too (prefill to decode); none when 0.
    prefix_states: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    prefix_blocks: int = 0

    @property
    def num_blocks(self) -> int:
        return self.layers[0][0].shape[0] if self.layers else 0


class PageFormatError(ValueError):
    """Pages that do not match this node's format or model."""


def pack(pages: KVPages) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, metadata) of a tensor message carrying ``pages``."""
    tensors: dict[str, torch.Tensor] = {}
    for layer, (k, v) in enumerate(pages.layers):
        tensors[f"k{layer}"] = k
        tensors[f"v{layer}"] = v
    for prefix, states in (("", pages.states), ("prefix_", pages.prefix_states)):
        for layer, (conv, state) in enumerate(states):
            tensors[f"{prefix}conv{layer}"] = conv
            tensors[f"{prefix}state{layer}"] = state
    meta = {
        "format": PAGE_FORMAT,
        "num_layers": len(pages.layers),
        "num_state_layers": len(pages.states),
        "num_blocks": pages.num_blocks,
        "prefix_blocks": pages.prefix_blocks if pages.prefix_states else 0,
    }
    return tensors, meta


def unpack(tensors: dict[str, torch.Tensor], meta: dict, num_layers: int, num_state_layers: int = 0) -> KVPages:
    """Pages for a model of ``num_layers`` KV layers; with ``num_state_layers``, a request's state
    may come along (all of it or none: a cached prefix has none)."""
    if meta.get("format") != PAGE_FORMAT:
        raise PageFormatError(f"KV pages in format {meta.get('format')!r}; this node reads {PAGE_FORMAT!r}")
    if meta.get("num_layers") != num_layers:
        raise PageFormatError(f"KV pages for {meta.get('num_layers')} layers; this model has {num_layers}")
    if meta.get("num_state_layers") not in (0, num_state_layers):
        raise PageFormatError(f"state for {meta.get('num_state_layers')} layers; this model has {num_state_layers}")
    try:
        layers = [(tensors[f"k{i}"], tensors[f"v{i}"]) for i in range(num_layers)]
        states = [(tensors[f"conv{j}"], tensors[f"state{j}"]) for j in range(meta["num_state_layers"])]
        prefix_blocks = int(meta.get("prefix_blocks", 0))
        prefix_states = [(tensors[f"prefix_conv{j}"], tensors[f"prefix_state{j}"]) for j in range(num_state_layers if prefix_blocks else 0)]
    except KeyError as exc:
        raise PageFormatError(f"KV pages lack tensor {exc.args[0]}") from None
    if any(k.shape != v.shape or k.shape[0] != meta.get("num_blocks") for k, v in layers):
        raise PageFormatError("KV pages disagree with their block count or between K and V")
    if prefix_blocks > meta["num_blocks"]:
        raise PageFormatError(f"a state after block {prefix_blocks} of {meta['num_blocks']}")
    return KVPages(layers, states, prefix_states, prefix_blocks)
