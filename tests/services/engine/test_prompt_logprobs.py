"""Prompt logprobs equal transformers' log-softmax at every prompt position, whether the prompt
runs in one step or in chunks, and on a prompt whose prefix is cached (it is recomputed); the
rank and the top alternatives are the vocabulary's."""

from __future__ import annotations

import torch

from services.engine.logprob_ranking import top_alternatives
from services.engine.prompt_logprobs import LOGIT_ROWS_PER_PASS
from services.engine.sampling_params import PromptTokenLogprobs, SamplingParams
from tests.factories import chat_case, encode_image, make_image


def prompt_logprobs_of(llm, case, params: SamplingParams, request_id: str = "r") -> tuple[list[PromptTokenLogprobs], int]:
    llm.engine.add_request(request_id, llm.preprocessor.preprocess(case.prompt), params)
    found, num_cached = None, 0
    for output in llm.engine.run_to_completion():
        if output.prompt_logprobs is not None:
            assert found is None, "prompt logprobs come once, with the first token"
            found, num_cached = output.prompt_logprobs, output.num_cached_tokens
    assert found is not None
    return found, num_cached


def assert_equal_to_oracle(got: list[PromptTokenLogprobs], oracle, case, k: int) -> None:
    inputs = oracle.process(oracle.chat_text(case.oracle_messages), case.images)
    expected = oracle.prompt_logprobs(inputs)
    token_ids = inputs.token_ids
    assert [lp.token_id for lp in got] == token_ids[1:]
    for i, lp in enumerate(got):
        row = expected[i]
        assert abs(lp.logprob - row[lp.token_id].item()) < 1e-4, i
        value = row[lp.token_id]
        assert 1 + int((row > value + 1e-4).sum()) <= lp.rank <= 1 + int((row > value - 1e-4).sum()), i  # ties within rounding
        assert len(lp.top) == k
        assert all(abs(v - row[t].item()) < 1e-4 for t, v in lp.top), i
        assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)
        if k:
            assert abs(lp.top[0][1] - row.max().item()) < 1e-4


def test_prompt_logprobs_equal_transformers_in_one_step_and_in_chunks(make_llm, oracle):
    case = chat_case(encode_image(make_image(84, 84, seed=5)), "Describe the picture in detail, please.")
    params = SamplingParams(max_tokens=2, prompt_logprobs=3)
    whole, _ = prompt_logprobs_of(make_llm(), case, params)
    assert_equal_to_oracle(whole, oracle, case, 3)
    chunked, _ = prompt_logprobs_of(make_llm(max_num_batched_tokens=32), case, params)
    assert [lp.token_id for lp in chunked] == [lp.token_id for lp in whole]
    assert all(abs(a.logprob - b.logprob) < 1e-4 for a, b in zip(chunked, whole))


def test_a_cached_prefix_is_recomputed_for_prompt_logprobs(make_llm, oracle):
    llm = make_llm()
    case = chat_case("A long enough question about the weather in several places, asked twice, word for word.")
    llm.generate([case.prompt], SamplingParams(max_tokens=2))  # fills the prefix cache
    got, num_cached = prompt_logprobs_of(llm, case, SamplingParams(max_tokens=2, prompt_logprobs=0))
    assert num_cached == 0
    assert_equal_to_oracle(got, oracle, case, 0)
    [again] = llm.generate([case.prompt], SamplingParams(max_tokens=2))
    assert again.usage.cached_tokens > 0  # the recomputed blocks are cached as before


def test_requests_without_prompt_logprobs_get_none(make_llm):
    llm = make_llm()
    llm.engine.add_request("plain", llm.preprocessor.preprocess(chat_case("Hello there").prompt), SamplingParams(max_tokens=3))
    assert all(output.prompt_logprobs is None for output in llm.engine.run_to_completion())


def test_long_prompts_are_scored_a_pass_of_rows_at_a_time(make_llm, oracle):
    case = chat_case(" ".join(["word"] * (LOGIT_ROWS_PER_PASS + 30)))
    got, _ = prompt_logprobs_of(make_llm(), case, SamplingParams(max_tokens=1, prompt_logprobs=1))
    assert_equal_to_oracle(got, oracle, case, 1)


def test_the_rank_counts_the_tokens_more_likely():
    from services.engine.prompt_logprobs import _records

    logprobs = torch.log_softmax(torch.tensor([[0.0, 3.0, 1.0, 2.0]]), dim=-1)
    [record] = _records(logprobs, [2], 2)
    assert record.rank == 3 and [t for t, _ in record.top] == [1, 3]


def test_whole_vocabulary_prompt_logprobs_rank_every_token_as_transformers(make_llm, oracle):
    """--max-logprobs -1 lets a request ask for every token's logprob at every prompt position."""
    llm = make_llm()
    case = chat_case("Hi")
    vocab = llm.engine.runner.checkpoint.shape.vocab_size
    got, _ = prompt_logprobs_of(llm, case, SamplingParams(max_tokens=1, prompt_logprobs=vocab))
    expected = oracle.prompt_logprobs(oracle.process(oracle.chat_text(case.oracle_messages), case.images))
    for i in (0, len(got) // 2, len(got) - 1):
        ids, values = zip(*got[i].top)
        assert len(ids) == vocab and sorted(ids) == list(range(vocab))
        assert torch.allclose(torch.tensor(values), expected[i][list(ids)], atol=1e-4)
        assert list(values) == sorted(values, reverse=True)


def test_the_ranking_orders_ties_by_token_id_for_a_few_and_for_many():
    row = torch.tensor([[0.0, -1.0, 0.0, -1.0, -2.0] + [-5.0] * 100])
    assert top_alternatives(row, 3) == [((0, 0.0), (2, 0.0), (1, -1.0))]
    assert top_alternatives(row, 70)[0][:5] == ((0, 0.0), (2, 0.0), (1, -1.0), (3, -1.0), (4, -2.0))
    assert [t for t, _ in top_alternatives(row, 70)[0][5:]] == list(range(5, 70))
