"""Sampling parameters, the sampler, and stop conditions end to end."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kernels.race import Race
from services.engine.sampling import Sampler, SamplingError, TokenHistory
from services.engine.sampling_params import SamplingParams
from tests.factories import chat_case


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"stop": ("",)}, "stop"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3.0}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"min_tokens": 20, "max_tokens": 10}, "min_tokens"),
        ({"logit_bias": ((3, 1.0), (3, 2.0))}, "logit_bias"),
    ],
)
def test_invalid_parameters_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def no_history(num_requests: int) -> list[TokenHistory]:
    return [TokenHistory((), ())] * num_requests


def at_position(position: int, num_requests: int = 1) -> list[TokenHistory]:
    """Histories whose next output token is at ``position``."""
    return [TokenHistory((), (0,) * position)] * num_requests


def test_seeded_sampling_is_reproducible_and_independent_of_batch():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=1.0, seed=42)
    draws = []
    for _ in range(2):
        sampler = Sampler()
        draws.append([sampler.sample(logits[:1], ["a"], [params], at_position(k))[0] for k in range(5)])
    batched_sampler = Sampler()
    pair = [params, SamplingParams(temperature=1.0)]
    batched = [batched_sampler.sample(logits[[0, 1]], ["a", "b"], pair, at_position(k, 2))[0] for k in range(5)]
    assert draws[0] == draws[1] == batched and len(set(batched)) > 1


def test_a_seeded_draw_depends_only_on_the_seed_and_the_position():
    """A node that samples a request's later tokens (decode after prefill, or after a migration)
    draws what one node sampling every token would."""
    params = [SamplingParams(temperature=1.0, seed=42)]
    one_node = Sampler()
    every_draw = [one_node.gumbel(["a"], params, [k], 100) for k in range(4)]
    assert torch.equal(Sampler().gumbel(["a"], params, [3], 100), every_draw[3])
    assert not torch.equal(every_draw[1], every_draw[2])
    other_seed = Sampler().gumbel(["a"], [SamplingParams(temperature=1.0, seed=43)], [3], 100)
    assert not torch.equal(other_seed, every_draw[3])


def test_top_k_1_and_tiny_top_p_are_greedy():
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(1))
    sampler = Sampler()
    greedy = logits.argmax(-1).tolist()
    ids = [str(i) for i in range(4)]
    assert sampler.sample(logits, ids, [SamplingParams(temperature=2.0, top_k=1, seed=1)] * 4, no_history(4)) == greedy
    assert sampler.sample(logits, ids, [SamplingParams(temperature=2.0, top_p=1e-6, seed=1)] * 4, no_history(4)) == greedy


def test_top_k_restricts_the_support():
    logits = torch.arange(10, dtype=torch.float32)
    sampler = Sampler()
    params = [SamplingParams(temperature=5.0, top_k=3, seed=3)]
    draws = {sampler.sample(logits[None], ["r"], params, at_position(k))[0] for k in range(200)}
    assert draws <= {7, 8, 9} and len(draws) > 1


def test_top_p_and_min_p_restrict_the_support():
    """Three tokens hold nearly all the mass (a third each): top_p=0.6 keeps two of them, and
    min_p=0.5 keeps the two with the largest logits of [0, ..., 5, 5]."""
    sampler = Sampler()
    three = torch.tensor([5.0, 5.0, 5.0] + [0.0] * 7)
    top_p = [SamplingParams(temperature=1.0, top_p=0.6, seed=4)]
    draws = {sampler.sample(three[None], ["p"], top_p, at_position(k))[0] for k in range(200)}
    assert draws < {0, 1, 2} and len(draws) == 2
    two = torch.tensor([0.0] * 8 + [5.0, 5.0])
    min_p = [SamplingParams(temperature=1.0, min_p=0.5, seed=4)]
    draws = {sampler.sample(two[None], ["m"], min_p, at_position(k))[0] for k in range(200)}
    assert draws == {8, 9}


def test_nan_logits_fail_that_request_only():
    logits = torch.randn(2, 20)
    logits[0, 3] = float("nan")
    params = [SamplingParams(temperature=1.0, top_p=0.9), SamplingParams(temperature=1.0)]
    failed, fine = Sampler().sample(logits, ["bad", "good"], params, no_history(2))
    assert isinstance(failed, SamplingError) and "NaN" in str(failed) and isinstance(fine, int)


def test_a_sampled_request_with_a_nan_hidden_state_fails_alone(make_llm):
    """The model runner races plain sampled rows itself; a row whose hidden state is NaN goes to
    the sampler, which fails that request, and the engine goes on."""
    llm = make_llm()
    engine, decoder = llm.engine, llm.engine.runner.decoder
    forward = decoder.forward

    def poisoned(*args, **kwargs):
        hidden = forward(*args, **kwargs)
        hidden[-1] = float("nan")  # the last scheduled request's row
        return hidden

    decoder.forward = poisoned
    engine.add_request("nan", llm.preprocessor.preprocess(chat_case("Hi.").prompt), SamplingParams(max_tokens=4, temperature=1.0))
    failures = []
    for _ in range(4):  # bounded: the request fails on its first sampled step
        engine.step()
        failures += engine.take_failures()
        if not engine.has_unfinished():
            break
    decoder.forward = forward
    assert [(rid, type(error)) for rid, error in failures] == [("nan", SamplingError)]
    [again] = llm.generate([chat_case("Hi.").prompt], SamplingParams(max_tokens=4, temperature=1.0, seed=1))
    assert len(again.token_ids) == 4


def test_stop_strings_tokens_and_max_tokens(make_llm):
    llm = make_llm()
    prompt = chat_case("Tell me something.").prompt
    [free] = llm.generate([prompt], SamplingParams(max_tokens=12, ignore_eos=True))
    assert free.finish_reason == "length" and len(free.token_ids) == 12
    # Stop on the 4th generated token id.
    [by_token] = llm.generate([prompt], SamplingParams(max_tokens=12, stop_token_ids=(free.token_ids[3],), ignore_eos=True))
    assert by_token.finish_reason == "stop" and by_token.token_ids == free.token_ids[:4]
    # Stop on a string taken from the middle of the free-running text; the text is cut before it.
    stop = free.text[len(free.text) // 2 :][:4]
    [by_string] = llm.generate([prompt], SamplingParams(max_tokens=12, stop=(stop,), ignore_eos=True))
    assert by_string.finish_reason == "stop"
    assert stop not in by_string.text and free.text.startswith(by_string.text)


def test_an_unfiltered_row_is_the_race_of_its_own_noise():
    """The sampler's path and the model runner's (Sampler.gumbel, then the race) give the same
    token for a seeded request: the noise is one draw per step from the request's generator."""
    logits = torch.randn(1, 300, generator=torch.Generator().manual_seed(4))
    params = SamplingParams(temperature=0.7, seed=9)
    sampler, racer = Sampler(), Sampler()
    sampled = [sampler.sample(logits, ["a"], [params], at_position(k))[0] for k in range(20)]
    raced = [int(Race.build([0.7], racer.gumbel(["a"], [params], [k], 300)).scores(logits).argmax()) for k in range(20)]
    assert sampled == raced and len(set(sampled)) > 1


@pytest.mark.parametrize("screen_greedy", [True, False], ids=["screened", "float32-head"])
def test_a_seeded_request_samples_the_same_tokens_on_every_path(screen_greedy, make_llm):
    """The model runner races a plain sampled request itself (through the screened head, or the
    float32 one); asking for logprobs sends it through the sampler instead; batched beside
    another sampled request and a greedy one, or alone, the tokens are the same."""
    llm = make_llm(screen_greedy=screen_greedy)
    head = llm.engine.runner.decoder.screened_head
    if head is not None:
        head.max_rows = 8  # whatever the startup timing found worth it on this machine
    prompt, other = chat_case("Tell me a story.").prompt, chat_case("Count to ten.").prompt
    sampled = SamplingParams(max_tokens=12, temperature=0.9, seed=5, ignore_eos=True)
    num_screened = head.num_rows_screened if head is not None else 0
    [alone] = llm.generate([prompt], sampled)
    if head is not None:
        assert head.num_rows_screened - num_screened >= 11  # every decode step of the sampled request
    [with_logprobs] = llm.generate([prompt], dataclasses.replace(sampled, logprobs=0))
    greedy_params = SamplingParams(max_tokens=12, ignore_eos=True)
    batched, _, greedy_beside = llm.generate([prompt, other, prompt], [sampled, dataclasses.replace(sampled, seed=6), greedy_params])
    [greedy] = llm.generate([prompt], greedy_params)
    [reseeded] = llm.generate([prompt], dataclasses.replace(sampled, seed=7))
    assert alone.token_ids == with_logprobs.token_ids == batched.token_ids and greedy_beside.token_ids == greedy.token_ids
    assert alone.token_ids != greedy.token_ids and alone.token_ids != reseeded.token_ids
