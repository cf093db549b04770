"""LoRA slots: an adapter in use is never replaced; the least recently used idle one is."""

from __future__ import annotations

from pathlib import Path

from services.engine.lora.slots import LoraSlots
from services.engine.request import Request
from services.models.lora.adapter import LoraAdapter
from tests.services.engine.kv.test_kv_cache_manager import make_request


def adapter(name: str) -> LoraAdapter:
    return LoraAdapter(name, Path(name), fingerprint=f"fp-{name}", rank=4)


def with_lora(request_id: str, lora: LoraAdapter | None) -> Request:
    request = make_request(request_id, [1, 2, 3])
    request.lora = lora
    return request


def test_a_slot_in_use_is_never_replaced_and_an_idle_one_is_least_recently_used_first():
    slots = LoraSlots(2)
    a, b, c = adapter("a"), adapter("b"), adapter("c")
    ra, rb = with_lora("ra", a), with_lora("rb", b)
    slots.admit(ra)
    slots.admit(rb)
    assert [load[1].name for load in slots.pending_loads] == ["a", "b"]
    assert not slots.can_admit(with_lora("rc", c))  # both in use
    slots.release(ra)
    slots.release(rb)
    ra2 = with_lora("ra2", a)
    slots.admit(ra2)  # a used again: b is now the least recently used idle one
    slots.release(ra2)
    rc = with_lora("rc", c)
    assert slots.can_admit(rc)
    slots.admit(rc)
    assert slots.pending_loads[-1][1].name == "c" and slots.pending_loads[-1][0] == slots.slot_of(rc)
    assert set(slots.loaded()) == {"fp-a", "fp-c"}


def test_requests_without_an_adapter_take_no_slot():
    slots = LoraSlots(1)
    base = with_lora("base", None)
    assert slots.can_admit(base)
    slots.admit(base)
    assert slots.slot_of(base) is None and slots.pending_loads == []


def test_an_adapter_in_use_cannot_be_forgotten():
    slots = LoraSlots(1)
    request = with_lora("r", adapter("a"))
    slots.admit(request)
    assert not slots.forget(request.lora)
    slots.release(request)
    assert slots.forget(request.lora) and slots.loaded() == []
    assert slots.can_admit(with_lora("s", adapter("b")))
