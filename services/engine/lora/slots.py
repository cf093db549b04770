"""Which LoRA adapter each of the engine's ``max_loras`` slots holds, and which requests use it.

A request with an adapter runs only while its adapter holds a slot: the scheduler admits it when
the adapter holds one already, or a slot is free, or one holds an adapter no admitted request uses
(the least recently used such one is replaced). Admission pins the slot for the request until it
finishes or is preempted, so an adapter is never swapped out under a request computing with it.
A slot that changes adapter is loaded by the model runner before the next step (``pending_loads``).
"""

from __future__ import annotations

from collections import OrderedDict

from services.engine.request import Request
from services.models.lora.adapter import LoraAdapter


class LoraSlots:
    def __init__(self, num_slots: int) -> None:
        if num_slots <= 0:
            raise ValueError("max_loras must be positive to serve LoRA adapters")
        self.num_slots = num_slots
        self._slot_of: OrderedDict[str, int] = OrderedDict()  # adapter fingerprint -> slot, least recently used first
        self._users: dict[str, set[str]] = {}  # adapter fingerprint -> ids of admitted requests using it
        self._free = list(range(num_slots - 1, -1, -1))
        self._request_adapter: dict[str, str] = {}  # request id -> its adapter's fingerprint, while admitted
        self.pending_loads: list[tuple[int, LoraAdapter]] = []
        self.num_loads = 0

    def can_admit(self, request: Request) -> bool:
        adapter = request.lora
        if adapter is None or adapter.fingerprint in self._slot_of or self._free:
            return True
        return any(not self._users.get(fingerprint) for fingerprint in self._slot_of)

    def admit(self, request: Request) -> None:
        """Pin ``request``'s adapter in a slot (the caller checked can_admit)."""
        adapter = request.lora
        if adapter is None or request.request_id in self._request_adapter:
            return
        fingerprint = adapter.fingerprint
        if fingerprint not in self._slot_of:
            self._slot_of[fingerprint] = slot = self._take_slot()
            self.pending_loads.append((slot, adapter))
            self.num_loads += 1
        self._slot_of.move_to_end(fingerprint)
        self._users.setdefault(fingerprint, set()).add(request.request_id)
        self._request_adapter[request.request_id] = fingerprint

    def release(self, request: Request) -> None:
        fingerprint = self._request_adapter.pop(request.request_id, None)
        if fingerprint is not None:
            self._users.get(fingerprint, set()).discard(request.request_id)

    def slot_of(self, request: Request) -> int | None:
        """The slot of an admitted request's adapter; None without one."""
        fingerprint = self._request_adapter.get(request.request_id)
        return None if fingerprint is None else self._slot_of[fingerprint]

    def forget(self, adapter: LoraAdapter) -> bool:
        """Free ``adapter``'s slot (an unload); False while admitted requests still use it."""
        if self._users.get(adapter.fingerprint):
            return False
        slot = self._slot_of.pop(adapter.fingerprint, None)
        if slot is not None:
            self._free.append(slot)
        self._users.pop(adapter.fingerprint, None)
        return True

    def discard(self, adapter: LoraAdapter) -> None:
        """Forget ``adapter``'s slot whoever uses it (its weights could not be loaded): no request
        computes with a slot that does not hold its adapter; those that named it fail with the step."""
        slot = self._slot_of.pop(adapter.fingerprint, None)
        if slot is not None:
            self._free.append(slot)
        for request_id in self._users.pop(adapter.fingerprint, set()):
            self._request_adapter.pop(request_id, None)

    def loaded(self) -> list[str]:
        return list(self._slot_of)

    def _take_slot(self) -> int:
        if self._free:
            return self._free.pop()
        for fingerprint in self._slot_of:  # least recently used first
            if not self._users.get(fingerprint):
                self._users.pop(fingerprint, None)
                return self._slot_of.pop(fingerprint)
        raise RuntimeError("every LoRA slot is in use")  # callers check can_admit first
