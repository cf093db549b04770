"""SamplingParams to and from the wire (protos' SamplingParams): the gateway sends them, prefill
and decode nodes read them. Here, above transport, because transport must not know the engine."""

from __future__ import annotations

from protos.gen import pb
from services.engine.sampling import SamplingParams


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
