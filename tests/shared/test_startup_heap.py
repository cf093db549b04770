"""Freezing the start-up heap: what lives at start-up leaves the collector's generations; what
requests allocate later is collected as before."""

from __future__ import annotations

import gc

from shared.startup_heap import freeze_startup_heap


class Node:
    def __init__(self) -> None:
        self.peer: Node | None = None


def test_startup_objects_are_frozen_and_later_cycles_still_collected():
    kept = Node()
    try:
        assert freeze_startup_heap() > 0
        assert id(kept) not in {id(o) for o in gc.get_objects()}  # in the permanent generation, never walked
        later = Node()
        later.peer = later
        assert id(later) in {id(o) for o in gc.get_objects()}
        del later
        assert gc.collect() > 0
    finally:
        gc.unfreeze()
