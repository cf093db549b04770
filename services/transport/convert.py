"""Conversions between protobuf messages and plain Python records, at the edge only."""

from __future__ import annotations

from protos.gen import pb
from services.engine.sampling import SamplingParams
from shared.types import MmHash, PlaceholderRange


def item_to_pb(mm_hash: str, placeholder: PlaceholderRange, grid_thw: tuple[int, int, int]) -> pb.MmItem:
    return pb.MmItem(mm_hash=mm_hash, offset=placeholder.offset, length=placeholder.length, grid_thw=list(grid_thw))


def item_from_pb(item: pb.MmItem) -> tuple[MmHash, PlaceholderRange, tuple[int, int, int]]:
    return MmHash(item.mm_hash), PlaceholderRange(item.offset, item.length), tuple(item.grid_thw)


def sampling_to_pb(params: SamplingParams) -> pb.SamplingParams:
    msg = pb.SamplingParams(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        stop=list(params.stop),
        stop_token_ids=list(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
    )
    if params.seed is not None:
        msg.seed = params.seed
    return msg


def sampling_from_pb(msg: pb.SamplingParams) -> SamplingParams:
    return SamplingParams(
        max_tokens=msg.max_tokens,
        temperature=msg.temperature,
        top_p=msg.top_p,
        top_k=msg.top_k,
        seed=msg.seed if msg.HasField("seed") else None,
        stop=tuple(msg.stop),
        stop_token_ids=tuple(msg.stop_token_ids),
        ignore_eos=msg.ignore_eos,
    )
