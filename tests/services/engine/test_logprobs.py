"""Logprobs are the model's own: log-softmax of the float32 logits, equal to transformers' at
every step, with the top alternatives in order; requests that do not ask get none."""

from __future__ import annotations

import torch

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
