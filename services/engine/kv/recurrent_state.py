"""A hybrid decoder's per-request state (services/models/family.py's StateShape): one slot per
running request, holding every state layer's last convolution inputs and recurrent matrices.

Slots go with KV pages (kv_cache_manager.py): a request takes its slot when it takes its first
pages and gives it back when it frees them, so preemption and admission treat state as part of
the request's KV. A request computing its prompt from token 0 starts from a zero state: the model
runner clears its slot before that step, whoever held the slot before.

The pool has a fixed number of slots, carved from the KV budget (ModelRunner), because a state's
size does not grow with the context: a hybrid request costs one slot plus KV pages for its
attention layers only.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from services.models.family import StateShape
from shared.types import BlockHash

# Per state layer: (conv inputs (slots, conv_dim, conv_width), recurrent (slots, heads, key_dim, value_dim)).
StateStorage = list[tuple[torch.Tensor, torch.Tensor]]


def new_state_storage(shape: StateShape, num_slots: int, device: torch.device) -> StateStorage:
    """Zeroed state for ``num_slots`` requests. Float32 whatever the compute dtype: the recurrence
    runs in float32, as transformers' does."""
    return [
        (
            torch.zeros(num_slots, shape.conv_dim, shape.conv_width, device=device),
            torch.zeros(num_slots, shape.num_heads, shape.key_dim, shape.value_dim, device=device),
        )
        for _ in shape.layers
    ]


class StateSlots:
    """Which request holds which slot."""

    def __init__(self, num_slots: int) -> None:
        if num_slots <= 0:
            raise ValueError("a hybrid model needs at least one state slot")
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))
        self._slot_of: dict[str, int] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    def needs_slot(self, request_id: str) -> bool:
        return request_id not in self._slot_of

    def take(self, request_id: str) -> int:
        if request_id in self._slot_of:
            return self._slot_of[request_id]
        if not self._free:
            raise RuntimeError("no free state slot")  # callers check num_free first
        slot = self._free.pop()
        self._slot_of[request_id] = slot
        return slot

    def slot_of(self, request_id: str) -> int:
        return self._slot_of[request_id]

    def release(self, request_id: str) -> None:
        slot = self._slot_of.pop(request_id, None)
        if slot is not None:
            self._free.append(slot)


class StateSnapshots:
    """Saved states at block ends, for prefix hits: block hash -> snapshot id, least recently used
    evicted first, never more than ``capacity`` (their storage is fixed: ModelRunner). The state
    saved under a block's hash is a request's state after that block's last token; since a block
    hash covers every token before it (and each image's identity), any request whose prefix has
    that hash reaches the same state there."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._id_of: OrderedDict[BlockHash, int] = OrderedDict()
        self._free = list(range(capacity - 1, -1, -1))
        self.num_evictions = 0
        self._changed: list[BlockHash] = []  # saved or evicted since the last drain_changes

    def drain_changes(self) -> list[BlockHash]:
        """The blocks whose state was saved or evicted since the last call (the cluster index
        learns where this node can resume: KVCacheManager.drain_events)."""
        changed, self._changed = self._changed, []
        return changed

    def __len__(self) -> int:
        return len(self._id_of)

    def lookup(self, block_hash: BlockHash) -> int | None:
        snapshot = self._id_of.get(block_hash)
        if snapshot is not None:
            self._id_of.move_to_end(block_hash)
        return snapshot

    def holds(self, block_hash: BlockHash) -> bool:
        return block_hash in self._id_of

    def drop(self, block_hash: BlockHash) -> None:
        """Forget the state after ``block_hash`` (its block's KV was evicted: no hit can end
        there any more), freeing its storage."""
        snapshot = self._id_of.pop(block_hash, None)
        if snapshot is not None:
            self._free.append(snapshot)
            self._changed.append(block_hash)

    def save(self, block_hash: BlockHash) -> int | None:
        """The id to write the state after ``block_hash`` into (its old one if held), evicting the
        least recently used; None when there is no storage at all."""
        if block_hash in self._id_of:
            self._id_of.move_to_end(block_hash)
            return self._id_of[block_hash]
        if not self._free:
            if not self._id_of:
                return None
            dropped, evicted = self._id_of.popitem(last=False)
            self._free.append(evicted)
            self._changed.append(dropped)
            self.num_evictions += 1
        snapshot = self._free.pop()
        self._id_of[block_hash] = snapshot
        self._changed.append(block_hash)
        return snapshot
