"""SamplingParams and TokenLogprobs to and from the wire: the gateway sends sampling, prefill and
decode nodes read it and send logprobs back. Here, above transport, because transport must not
know the engine."""

from __future__ import annotations

import functools
from collections.abc import Callable

from protos.gen import pb
from services.engine.sampling_params import PromptTokenLogprobs, SamplingParams, StructuredOutput, TokenLogprobs


def sampling_to_pb(params: SamplingParams) -> pb.SamplingParams:
    msg = pb.SamplingParams(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        stop=list(params.stop),
        stop_token_ids=list(params.stop_token_ids),
        ignore_eos=params.ignore_eos,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        min_p=params.min_p,
        min_tokens=params.min_tokens,
        logit_bias=dict(params.logit_bias),
        allowed_token_ids=list(params.allowed_token_ids or ()),
        logprob_token_ids=list(params.logprob_token_ids or ()),
    )
    if params.structured is not None:
        structured = params.structured
        msg.structured.CopyFrom(
            pb.StructuredOutput(kind=structured.kind, spec=structured.spec, compact_whitespace=structured.compact_whitespace)
        )
    if params.repetition_penalty != 1.0:
        msg.repetition_penalty = params.repetition_penalty
    if params.seed is not None:
        msg.seed = params.seed
    if params.logprobs is not None:
        msg.logprobs = params.logprobs
    if params.prompt_logprobs is not None:
        msg.prompt_logprobs = params.prompt_logprobs
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
        prompt_logprobs=msg.prompt_logprobs if msg.HasField("prompt_logprobs") else None,
        presence_penalty=msg.presence_penalty,
        frequency_penalty=msg.frequency_penalty,
        repetition_penalty=msg.repetition_penalty if msg.HasField("repetition_penalty") else 1.0,
        min_p=msg.min_p,
        min_tokens=msg.min_tokens,
        logit_bias=tuple(sorted(msg.logit_bias.items())),
        allowed_token_ids=tuple(msg.allowed_token_ids) or None,
        logprob_token_ids=tuple(msg.logprob_token_ids) or None,
        structured=_structured_from_pb(msg.structured) if msg.HasField("structured") else None,
    )


def _structured_from_pb(msg: pb.StructuredOutput) -> StructuredOutput:
    if msg.kind not in ("json", "regex", "choice", "grammar"):
        raise ValueError(f"unknown structured output kind {msg.kind!r}")
    return StructuredOutput(msg.kind, msg.spec, msg.compact_whitespace)


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


def prompt_logprobs_to_pb(logprobs: PromptTokenLogprobs, token_text: Callable[[int], str]) -> pb.PromptLogprob:
    return pb.PromptLogprob(
        token_id=logprobs.token_id,
        logprob=logprobs.logprob,
        rank=logprobs.rank,
        top_token_ids=[t for t, _ in logprobs.top],
        top_logprobs=[v for _, v in logprobs.top],
        token=token_text(logprobs.token_id),
        top_tokens=[token_text(t) for t, _ in logprobs.top],
    )


def token_texts(tokenizer) -> Callable[[int], str]:
    """A token's own text, for logprobs (U+FFFD when the token is part of a character); cached,
    as a node reports the same tokens again and again: at most one entry per vocabulary token, so
    whole-vocabulary logprobs (--max-logprobs -1) decode each token once."""
    return functools.lru_cache(maxsize=max(65536, len(tokenizer)))(lambda token_id: tokenizer.decode([token_id]))


def prompt_logprobs_from_pb(msg: pb.PromptLogprob) -> PromptTokenLogprobs:
    return PromptTokenLogprobs(msg.token_id, msg.logprob, msg.rank, tuple(zip(msg.top_token_ids, msg.top_logprobs)))
