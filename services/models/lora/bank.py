"""Many LoRA adapters in one batch: a fixed number of slots, each holding one adapter's weights,
and the linear layers they may change wrapped so that every row gets its own adapter's update.

For a step, the model runner says which rows belong to which slot (``LoraBank.rows``); a wrapped
layer computes the base product for the whole batch, then, per slot with rows, adds
(x[rows] @ A^T) @ B^T to those rows (B carries the scaling). Rows of requests without an adapter
get nothing added, so the base model's rows in a mixed batch compute exactly what they compute
alone. The update is applied unmerged, as vLLM does, so one set of base weights serves every
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
    adapter's weights for this tree into a slot."""

    def __init__(self, num_slots: int, group: str) -> None:
        self.num_slots = num_slots
        self.group = group  # "text" or "vision": which of an adapter's weights this bank takes
        self.layer_names: set[str] = set()
        self._slots: list[dict[str, LoraWeights]] = [{} for _ in range(num_slots)]
        self._rows: SlotRows = []

    @property
    def active(self) -> bool:
        return bool(self._rows)

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
                self.layer_names.add(full)
                count += 1
        return count

    def load(self, slot: int, adapter: LoraAdapter) -> None:
        weights = adapter.text if self.group == "text" else adapter.vision
        unknown = sorted(set(weights) - self.layer_names)
        if unknown:
            raise ValueError(f"LoRA adapter {adapter.name!r} targets {unknown[:3]}, not linear layers of this model")
        self._slots[slot] = dict(weights)

    def clear(self, slot: int) -> None:
        self._slots[slot] = {}

    @contextlib.contextmanager
    def rows(self, slot_rows: SlotRows) -> Iterator[None]:
        """Within the block, rows ``slot_rows[i][1]`` of every batch get slot ``slot_rows[i][0]``'s update."""
        self._rows = [(slot, rows) for slot, rows in slot_rows if self._slots[slot]]
        try:
            yield
        finally:
            self._rows = []

    def update(self, name: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``y`` (the base layer's output for ``x``, rows first) plus each slot's update on its rows."""
        for slot, rows in self._rows:
            weights = self._slots[slot].get(name)
            if weights is None:
                continue
            if rows.numel() == x.shape[0]:  # every row: no gather
                y = y + (x @ weights.a.t()) @ weights.b.t()
            else:
                y = y.index_add(0, rows, (x.index_select(0, rows) @ weights.a.t()) @ weights.b.t())
        return y


def _is_linear(module: nn.Module) -> bool:
    return isinstance(module, (nn.Linear, PackedLinear))
