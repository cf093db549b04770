"""Logprobs are the model's own: log-softmax of the float32 logits, equal to transformers' at
every step, with the top alternatives in order; requests that do not ask get none."""

from __future__ import annotations

import pytest
import torch

from services.engine.engine import RequestRejectedError
from services.engine.sampling import Sampler
from services.engine.sampling_params import SamplingParams, TokenLogprobs
from tests.factories import chat_case, encode_image, make_image
from tests.services.engine.conftest import oracle_tokens


def run(llm, cases_and_params) -> dict[str, list[TokenLogprobs]]:
    ids = []
    for i, (case, params) in enumerate(cases_and_params):
        llm.engine.add_request(f"r{i}", llm.preprocessor.preprocess(case.prompt), params)
        ids.append(f"r{i}")
    logprobs: dict[str, list[TokenLogprobs]] = {rid: [] for rid in ids}
    for output in llm.engine.run_to_completion():
        assert len(output.new_logprobs) in (0, len(output.new_token_ids))
        logprobs[output.request_id].extend(output.new_logprobs)
    return logprobs


def test_logprobs_equal_the_oracles_log_softmax_at_every_step(make_llm, oracle):
    case = chat_case(encode_image(make_image(84, 84, seed=3)), "What is it?")
    plain = chat_case("No logprobs for me.")
    got = run(make_llm(), [(case, SamplingParams(max_tokens=8, ignore_eos=True, logprobs=3)), (plain, SamplingParams(max_tokens=8))])
    assert got["r1"] == []
    reference = oracle_tokens(oracle, case, max_new_tokens=8)
    assert [lp.token_id for lp in got["r0"]] == reference.token_ids
    for step, (mine, logits) in enumerate(zip(got["r0"], reference.step_logits)):
        expected = torch.log_softmax(logits.float(), dim=-1)
        assert abs(mine.logprob - expected[mine.token_id].item()) < 1e-4, step
        top_values, top_ids = expected.topk(3)
        assert [t for t, _ in mine.top] == top_ids.tolist(), step
        assert all(abs(v - e) < 1e-4 for (_, v), e in zip(mine.top, top_values.tolist()))
        assert mine.top[0][0] == mine.token_id  # greedy: the sampled token is the most likely


def test_zero_logprobs_gives_the_sampled_token_only():
    [lp] = Sampler.logprobs(torch.tensor([[0.0, 1.0, 2.0]]), [1], [SamplingParams(logprobs=0)])
    assert lp.token_id == 1 and lp.top == () and abs(lp.logprob - torch.log_softmax(torch.tensor([0.0, 1.0, 2.0]), 0)[1].item()) < 1e-6


def test_allowed_token_ids_sample_as_transformers_prefix_allowed_tokens_and_named_ids_get_raw_logprobs(make_llm, oracle):
    """allowed_token_ids constrain the draw (transformers' prefix_allowed_tokens_fn is the same
    mask); the logprobs stay the raw model's, so ids outside the allowed set are finite, and
    logprob_token_ids report the sampled token and exactly the ids named."""
    case = chat_case("Pick a token.")
    allowed, named = (40, 97, 311, 1000, 5000), (7, 311, 5000)
    params = SamplingParams(max_tokens=6, ignore_eos=True, logprobs=5, allowed_token_ids=allowed, logprob_token_ids=named)
    [got] = run(make_llm(), [(case, params)]).values()
    reference = oracle_tokens(oracle, case, max_new_tokens=6, prefix_allowed_tokens_fn=lambda batch, ids: list(allowed))
    assert [lp.token_id for lp in got] == reference.token_ids and set(reference.token_ids) <= set(allowed)
    for step, (mine, logits) in enumerate(zip(got, reference.step_logits)):
        expected = torch.log_softmax(logits.float(), dim=-1)
        assert [t for t, _ in mine.top] == list(dict.fromkeys((mine.token_id, *named))), step
        assert all(abs(v - expected[t].item()) < 1e-4 for t, v in mine.top), step


def test_logprob_token_ids_need_logprobs_and_allowed_ids_cannot_be_empty():
    with pytest.raises(ValueError, match="`logprobs` must be set"):
        SamplingParams(logprob_token_ids=(3,))
    with pytest.raises(ValueError, match="allowed_token_ids is empty"):
        SamplingParams(allowed_token_ids=())
    with pytest.raises(ValueError, match="1 to 128"):
        SamplingParams(logprobs=0, logprob_token_ids=tuple(range(129)))


def test_a_token_outside_the_vocabulary_is_refused_by_the_field_that_names_it(make_llm):
    llm = make_llm()
    prompt = llm.preprocessor.preprocess(chat_case("hi").prompt)
    vocab = llm.engine.runner.checkpoint.shape.vocab_size
    for params, field in (
        (SamplingParams(allowed_token_ids=(1, vocab)), "allowed_token_ids"),
        (SamplingParams(logprobs=1, logprob_token_ids=(vocab + 3,)), "logprob_token_ids"),
    ):
        with pytest.raises(RequestRejectedError, match=f"{field} names token id"):
            llm.engine.add_request(f"bad-{field}", prompt, params)
