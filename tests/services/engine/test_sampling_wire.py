"""SamplingParams survive the wire unchanged: every field the gateway sets reaches the node."""

from __future__ import annotations

from services.engine.sampling_params import SamplingParams, StructuredOutput
from services.engine.sampling_wire import sampling_from_pb, sampling_to_pb


def test_every_field_round_trips():
    params = SamplingParams(
        max_tokens=9,
        temperature=0.5,
        top_p=0.75,
        top_k=4,
        seed=-3,
        stop=("x",),
        stop_token_ids=(5,),
        ignore_eos=True,
        logprobs=2,
        prompt_logprobs=1,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.25,
        min_p=0.125,
        min_tokens=2,
        logit_bias=((3, 1.5), (8, -2.0)),
        allowed_token_ids=(3, 8, 21),
        logprob_token_ids=(21, 3),
        structured=StructuredOutput("regex", "a+"),
    )
    assert sampling_from_pb(sampling_to_pb(params)) == params


def test_defaults_round_trip_as_none():
    params = SamplingParams()
    assert sampling_from_pb(sampling_to_pb(params)) == params
    assert params.allowed_token_ids is None and params.logprob_token_ids is None
