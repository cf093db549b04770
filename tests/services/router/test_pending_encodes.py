"""Pending encodes: where this gateway sent an image to be encoded, kept while a request waits
on it and a linger after, and bounded."""

from __future__ import annotations

from services.router.pending_encodes import PendingEncodes
from shared.types import MmHash
from tests.fake_clock import FakeClock

A, B = MmHash("a"), MmHash("b")


def test_an_image_is_pending_where_it_was_sent_until_its_linger_after_the_last_request_ends():
    clock = FakeClock()
    pending = PendingEncodes(linger_s=2.0, clock=clock)
    end_first = pending.begin({A: "e:1"})
    end_second = pending.begin({A: "e:1", B: "p:1"})
    assert pending.where([A, B, MmHash("c")]) == {A: "e:1", B: "p:1"}
    end_first()
    end_first()  # once, however often
    clock.now += 10.0
    assert pending.where([A]) == {A: "e:1"}  # the second request still waits on it
    end_second()
    clock.now += 1.9
    assert pending.where([A, B]) == {A: "e:1", B: "p:1"}  # lingering: the index may not list it yet
    clock.now += 0.2
    assert pending.where([A, B]) == {} and len(pending) == 0


def test_an_image_sent_elsewhere_moves_its_entry():
    pending = PendingEncodes(clock=FakeClock())
    pending.begin({A: "e:1"})
    pending.begin({A: "p:2"})  # e:1 failed the first request, say: the retry went to p:2
    assert pending.where([A]) == {A: "p:2"}


def test_past_its_budget_images_no_request_waits_on_are_dropped_first():
    clock = FakeClock()
    pending = PendingEncodes(max_entries=2, clock=clock)
    pending.begin({MmHash("old"): "e:1"})()
    pending.begin({A: "e:1"})
    pending.begin({B: "e:2"})
    assert len(pending) == 2 and pending.where([A, B]) == {A: "e:1", B: "e:2"}
