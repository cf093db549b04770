"""LoRA adapters on a vision tower and its projector, where a PEFT adapter targets them.

A tower pass runs one adapter for all of its images: callers group a batch's images by adapter
(an adapter's images are keyed apart anyway, shared/hashing.py mm_hash_for_adapter), and the
bank's whole-slot path adds that adapter's update to every row, whatever the layer's input shape
(the tower's layers see patch sequences, not the decoder's rows). Slots hold up to ``num_slots``
adapters' tower weights, by fingerprint; a new adapter takes a free slot or the least recently
used one. One lock spans a slot's choice and the pass, so a pass on another thread (a prefill
node's local tower beside its engine) never has its slot swapped under it.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterator

import torch
from torch import nn

from services.models.lora.adapter import LoraAdapter
from services.models.lora.bank import LoraBank


class TowerLoras:
    def __init__(self, root: nn.Module, num_slots: int, max_rank: int, device: torch.device | None = None) -> None:
        self.bank = LoraBank(num_slots, "vision", max_rank, device)
        self.bank.attach(root)
        self._slots: OrderedDict[str, int] = OrderedDict()  # fingerprint -> slot, least recently used first
        self._free = list(range(num_slots))
        self._lock = threading.Lock()

    def check(self, adapter: LoraAdapter) -> None:
        """Raise LoraAdapterError unless ``adapter``'s tower updates fit this tower's layers."""
        if adapter.vision:
            self.bank.check(adapter)

    @contextlib.contextmanager
    def running(self, adapter: LoraAdapter | None) -> Iterator[None]:
        """Within the block, the tower computes with ``adapter``'s tower and projector updates
        (None, or one that leaves the tower alone: the base tower)."""
        with self._lock:
            if adapter is None or not adapter.vision:
                yield
                return
            with self.bank.whole(self._slot_for(adapter)):
                yield

    def _slot_for(self, adapter: LoraAdapter) -> int:
        slot = self._slots.get(adapter.fingerprint)
        if slot is not None:
            self._slots.move_to_end(adapter.fingerprint)
            return slot
        slot = self._free.pop() if self._free else self._slots.popitem(last=False)[1]
        try:
            self.bank.load(slot, adapter)
        except Exception:
            self._free.append(slot)  # load leaves the slot cleared or as it was; either way unnamed
            self.bank.clear(slot)
            raise
        self._slots[adapter.fingerprint] = slot
        return slot
