"""How a model's layers share the KV pages: groups of layers by attention kind over one pool.

A page holds ``num_slots`` layers' K and V for ``block_size`` tokens. Layers are grouped by their
attention window (None: full attention; W: a sliding layer that reads only the last W keys).
Every group has a multiple of ``num_slots`` layers, so one logical block of a group is
``pages_per_block[g]`` pages, and all groups draw pages from one pool: a page released by a
sliding layer is as good as any other, and no fixed share of memory is set aside per kind.

Layer l of group g, at index i among g's layers, lives in page ``i // num_slots`` of each logical
block, at slot ``i % num_slots`` (one (K, V) storage tensor per slot). A model whose layers are
all alike has one group of one page per block spanning every layer: the layout of one page per
block and one tensor per layer.

A sliding group's page for logical block b may be released once no query can reach it: the next
query sits at position p >= num_computed_tokens and reads keys k > p - W, so blocks ending at or
before num_computed_tokens - W + 1 are out of every future window (``first_needed_block``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KVGroup:
    window: int | None  # None: full attention
    layers: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LayerPlace:
    group: int
    page: int  # which of the group's pages in a logical block
    slot: int  # which storage tensor of the page


@dataclass(frozen=True, slots=True)
class KVLayout:
    groups: tuple[KVGroup, ...]  # group 0 is full attention whenever any layer is
    num_slots: int

    @classmethod
    def uniform(cls, num_layers: int) -> KVLayout:
        return cls((KVGroup(None, tuple(range(num_layers))),), max(1, num_layers))

    @classmethod
    def from_windows(cls, windows: tuple[int | None, ...]) -> KVLayout:
        """One group per distinct window; full attention first."""
        return cls.of_layers(dict(enumerate(windows)))

    @classmethod
    def of_layers(cls, layer_windows: dict[int, int | None]) -> KVLayout:
        """The layout of the layers named (a hybrid decoder's state layers keep no KV), each with
        its window: one group per distinct window, full attention first."""
        keys = sorted(set(layer_windows.values()), key=lambda w: (w is not None, w or 0))
        groups = tuple(KVGroup(w, tuple(sorted(i for i, x in layer_windows.items() if x == w))) for w in keys)
        return cls(groups, math.gcd(*(len(g.layers) for g in groups)))

    @property
    def num_layers(self) -> int:
        """Layers that keep KV."""
        return sum(len(g.layers) for g in self.groups)

    @property
    def kv_layers(self) -> tuple[int, ...]:
        """The decoder layers that keep KV, in order (every layer, unless the model is hybrid)."""
        return tuple(sorted(layer for group in self.groups for layer in group.layers))

    def pages_per_block(self, group: int) -> int:
        return len(self.groups[group].layers) // self.num_slots

    @property
    def columns(self) -> list[tuple[int, int]]:
        """Every (group, page) pair: each has its own page table per request."""
        return [(g, j) for g in range(len(self.groups)) for j in range(self.pages_per_block(g))]

    def place(self, layer: int) -> LayerPlace:
        for g, group in enumerate(self.groups):
            if layer in group.layers:
                index = group.layers.index(layer)
                return LayerPlace(g, index // self.num_slots, index % self.num_slots)
        raise ValueError(f"layer {layer} is in no group")

    def first_needed_block(self, group: int, next_position: int, block_size: int) -> int:
        """The first logical block a query at ``next_position`` or later can read in ``group``."""
        window = self.groups[group].window
        if window is None:
            return 0
        return max(0, next_position - window + 1) // block_size
