"""SamplingParams and TokenLogprobs to and from the wire: the gateway sends sampling, prefill and
decode nodes read it and send logprobs back. Here, above transport, because transport must not
know the engine."""

from __future__ import annotations

from protos.gen import pb
from services.engine.sampling import SamplingParams, TokenLogprobs


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
    if params.logprobs is not None:
        msg.logprobs = params.logprobs
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
        logprobs=msg.logprobs if msg.HasField("logprobs") else None,
    )


def logprobs_to_pb(logprobs: TokenLogprobs, token_text=None) -> pb.TokenLogprob:
    """``token_text(token_id) -> str`` fills in the token strings (the decode node has a tokenizer)."""
    msg = pb.TokenLogprob(
        token_id=logprobs.token_id,
        logprob=logprobs.logprob,
        top_token_ids=[t for t, _ in logprobs.top],
        top_logprobs=[v for _, v in logprobs.top],
    )
    if token_text is not None:
        msg.token = token_text(logprobs.token_id)
        msg.top_tokens.extend(token_text(t) for t, _ in logprobs.top)
    return msg


def logprobs_from_pb(msg: pb.TokenLogprob) -> TokenLogprobs:
    return TokenLogprobs(msg.token_id, msg.logprob, tuple(zip(msg.top_token_ids, msg.top_logprobs)))
