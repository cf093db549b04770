"""Many LoRA adapters in one batch: a fixed number of slots, each holding one adapter's weights,
and the linear layers they may change wrapped so that every row gets its own adapter's update.

For a step, the model runner says which rows belong to which slot (``LoraBank.rows``); a wrapped
layer computes the base product for the whole batch, then adds each row's (x @ A^T) @ B^T for
its slot's adapter (B carries the scaling; LoraBank says how every slot is done at once). Rows of
requests without an adapter get exact zeros added, so the base model's rows in a mixed batch
compute exactly what they compute alone. The update is applied unmerged, as vLLM does, so one set of base weights serves every
adapter; against transformers with the adapter merged into W the sums differ only in rounding
(the oracle tests compare greedy tokens).

One compute thread runs the model (shared/compute_thread.py), so the step's rows are plain state
set before the forward pass and cleared after it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from kernels.cpu_linear import PackedLinear
from services.models.lora.adapter import LoraAdapter, LoraWeights
from services.models.lora.files import LoraAdapterError

# Which rows of the batch belong to which slot: (slot, row indices) for slots with rows.
SlotRows = list[tuple[int, torch.Tensor]]


class LoraLinear(nn.Module):
    """``base(x)``, plus each row's adapter update where its slot changes this layer."""

    def __init__(self, base: nn.Module, bank: LoraBank, name: str) -> None:
        super().__init__()
        self.base = base
        self.bank = bank
        self.name = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        return self.bank.update(self.name, x, y) if self.bank.active else y


class LoraBank:
    """``num_slots`` adapter slots over the linear layers of one module tree (a decoder, or a
    vision tower). ``attach`` wraps every linear layer an adapter may target; ``load`` puts an
    adapter's weights for this tree into a slot.

    Every slot's weights for a layer sit in one stacked pair, each slot padded to ``max_rank``
    with zeros: A (slots * max_rank, in) and B (out, slots * max_rank). A step with rows of
    several slots then costs two products per layer whatever the number of adapters,
    ``((x @ A^T) * mask) @ B^T``, the mask keeping for each row only its own slot's columns (a
    row without an adapter keeps none, so exact zeros are added to it); a step whose rows are all
    one slot's uses that slot's columns alone, with no mask."""

    def __init__(self, num_slots: int, group: str, max_rank: int, device: torch.device | None = None) -> None:
        self.num_slots = num_slots
        self.group = group  # "text" or "vision": which of an adapter's weights this bank takes
        self.max_rank = max_rank
        self.device = device or torch.device("cpu")  # where the stacked weights live: the model's device
        self.layer_shapes: dict[str, tuple[int, int]] = {}  # wrapped layer -> (out, in) features
        self._stacked: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # layer -> (A, B) over every slot
        self._slot_layers: list[set[str]] = [set() for _ in range(num_slots)]  # the layers each slot's adapter changes
        self._mask: torch.Tensor | None = None  # (rows, slots * max_rank) for this step
        self._whole: int | None = None  # the slot of every row of this step, when it is one
        self.active = False

    def attach(self, root: nn.Module, prefix: str = "") -> int:
        """Wrap every linear layer under ``root`` (plain or prepacked for oneDNN), named as the
        adapter names them with ``prefix`` (root's own name in the model); returns how many."""
        count = 0
        for name, module in list(root.named_modules(prefix=prefix)):
            for child_name, child in list(module.named_children()):
                if isinstance(child, LoraLinear) or not _is_linear(child):
                    continue
                full = f"{name}.{child_name}" if name else child_name
                setattr(module, child_name, LoraLinear(child, self, full))
                self.layer_shapes[full] = (child.out_features, child.in_features)
                count += 1
        return count

    def check(self, adapter: LoraAdapter) -> None:
        """Raise LoraAdapterError unless every layer ``adapter`` changes is a wrapped linear layer
        of this model of the matching size (an adapter for a Qwen3.5-MoE expert, or one trained
        on a larger model of the family, is refused before any slot takes it)."""
        for name, w in (adapter.text if self.group == "text" else adapter.vision).items():
            shape = self.layer_shapes.get(name)
            if shape is None:
                raise LoraAdapterError(f"LoRA adapter {adapter.name!r} changes {name!r}, which is not a linear layer LoRA may change here")
            out_features, in_features = shape
            if w.a.shape[1] != in_features or w.b.shape[0] != out_features or w.rank > self.max_rank:
                raise LoraAdapterError(
                    f"LoRA adapter {adapter.name!r}: {name!r} is {tuple(w.b.shape[:1]) + tuple(w.a.shape[1:])} (out, in) "
                    f"with rank {w.rank}, this model's is {shape} with rank at most {self.max_rank}: an adapter for another model"
                )

    def load(self, slot: int, adapter: LoraAdapter) -> None:
        weights = adapter.text if self.group == "text" else adapter.vision
        self.check(adapter)  # before anything changes: a refused adapter leaves the slot as it was
        self.clear(slot)
        lo = slot * self.max_rank
        for name, w in weights.items():
            a, b = self._stacked_for(name, w)
            a[lo : lo + w.rank].copy_(w.a)
            b[:, lo : lo + w.rank].copy_(w.b)
        self._slot_layers[slot] = set(weights)

    def clear(self, slot: int) -> None:
        lo, hi = slot * self.max_rank, (slot + 1) * self.max_rank
        for name in self._slot_layers[slot]:
            a, b = self._stacked[name]
            a[lo:hi].zero_()
            b[:, lo:hi].zero_()
        self._slot_layers[slot] = set()

    @contextlib.contextmanager
    def rows(self, slot_rows: SlotRows, num_rows: int) -> Iterator[None]:
        """Within the block, rows ``slot_rows[i][1]`` of every batch of ``num_rows`` rows get
        slot ``slot_rows[i][0]``'s update."""
        used = [(slot, rows) for slot, rows in slot_rows if self._slot_layers[slot]]
        if len(used) == 1 and used[0][1].numel() == num_rows:
            self._whole = used[0][0]
        elif used:
            mask = torch.zeros(num_rows, self.num_slots * self.max_rank, device=used[0][1].device)
            for slot, rows in used:
                mask[rows, slot * self.max_rank : (slot + 1) * self.max_rank] = 1.0
            self._mask = mask
        self.active = bool(used)
        try:
            yield
        finally:
            self._mask, self._whole, self.active = None, None, False

    @contextlib.contextmanager
    def whole(self, slot: int) -> Iterator[None]:
        """Within the block, every row of every wrapped layer gets slot ``slot``'s update, whatever
        the inputs' shapes (a vision tower's pass, one adapter for all its images)."""
        self._whole, self.active = slot, bool(self._slot_layers[slot])
        try:
            yield
        finally:
            self._whole, self.active = None, False

    def update(self, name: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``y`` (the base layer's output for ``x``, rows first) plus each row's slot's update."""
        stacked = self._stacked.get(name)
        if stacked is None:
            return y
        a, b = stacked
        if self._whole is not None:
            lo, hi = self._whole * self.max_rank, (self._whole + 1) * self.max_rank
            return y + (x @ a[lo:hi].t()) @ b[:, lo:hi].t()
        return y + ((x @ a.t()) * self._mask) @ b.t()

    def _stacked_for(self, name: str, w: LoraWeights) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's stacked pair, made (zeros) when an adapter first changes it."""
        if name not in self._stacked:
            width = self.num_slots * self.max_rank
            a = torch.zeros(width, w.a.shape[1], dtype=w.a.dtype, device=self.device)
            b = torch.zeros(w.b.shape[0], width, dtype=w.b.dtype, device=self.device)
            self._stacked[name] = (a, b)
        return self._stacked[name]


def _is_linear(module: nn.Module) -> bool:
    return isinstance(module, (nn.Linear, PackedLinear))
