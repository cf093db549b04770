"""Conversions between protobuf messages and plain Python records, at the edge only."""

from __future__ import annotations

import time

from protos.gen import pb
from shared.types import GroupPlacement, LoraRef, MmHash, PlaceholderRange


def item_to_pb(
    mm_hash: MmHash, placeholder: PlaceholderRange, grid_thw: tuple[int, int, int], placement: GroupPlacement | None = None
) -> pb.MmItem:
    item = pb.MmItem(mm_hash=mm_hash, offset=placeholder.offset, length=placeholder.length, grid_thw=list(grid_thw))
    if placement is not None:
        item.placement.CopyFrom(pb.GroupPlacement(index=placement.index, time_position=placement.time_position))
    return item


def item_from_pb(item: pb.MmItem) -> tuple[MmHash, PlaceholderRange, tuple[int, int, int], GroupPlacement | None]:
    placement = GroupPlacement(item.placement.index, item.placement.time_position) if item.HasField("placement") else None
    return MmHash(item.mm_hash), PlaceholderRange(item.offset, item.length), tuple(item.grid_thw), placement


def lora_to_pb(lora: LoraRef | None) -> pb.LoraRef | None:
    return None if lora is None else pb.LoraRef(name=lora.name, fingerprint=lora.fingerprint, tower=lora.tower)


def lora_from_pb(message, field: str = "lora") -> LoraRef | None:
    """``message``'s LoraRef field, None when unset (the base model)."""
    if not message.HasField(field):
        return None
    lora = getattr(message, field)
    return LoraRef(lora.name, lora.fingerprint, lora.tower)


def call_deadline_s(context) -> float | None:
    """A call's gRPC deadline as a time.time() instant (None: the caller set none), for the calls
    it makes in turn: each gets what is left of it, as every call of a request does
    (services/gateway/pipeline/pipeline.py)."""
    remaining = context.time_remaining()
    return None if remaining is None else time.time() + remaining
