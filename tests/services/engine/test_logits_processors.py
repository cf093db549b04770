"""The logits processors against references written from vLLM's definitions."""

from __future__ import annotations

import pytest
import torch

from services.engine.logits_processors import apply_min_p, process_logits
from services.engine.sampling import Sampler, TokenHistory
from services.engine.sampling_params import SamplingParams

VOCAB = 40
EOS = frozenset({2})


def vllm_penalties(logits, prompt_tokens, output_tokens, presence, frequency, repetition):
    """vLLM's apply_penalties, batched as it is there: bin counts and masks over the vocabulary;
    repetition over prompt | output, frequency and presence over the output only."""
    num_seqs, vocab = logits.shape
    prompt_mask = torch.zeros(num_seqs, vocab, dtype=torch.bool)
    output_counts = torch.zeros(num_seqs, vocab)
    for row in range(num_seqs):
        prompt_mask[row, prompt_tokens[row]] = True
        for token in output_tokens[row]:
            output_counts[row, token] += 1
    output_mask = output_counts > 0
    repetition_penalties = repetition.unsqueeze(1).repeat(1, vocab)
    repetition_penalties[~(prompt_mask | output_mask)] = 1.0
    logits = torch.where(logits > 0, logits / repetition_penalties, logits * repetition_penalties)
    logits = logits - frequency.unsqueeze(1) * output_counts
    return logits - presence.unsqueeze(1) * output_mask


def random_history(generator, length):
    return torch.randint(0, VOCAB, (length,), generator=generator).tolist()


def test_penalties_equal_vllms_definition():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, VOCAB, generator=generator) * 3
    prompts = [random_history(generator, 10 + row) for row in range(6)]
    outputs = [random_history(generator, row * 3) for row in range(6)]  # row 0 has no output yet
    presence = torch.tensor([0.0, 0.5, -1.0, 2.0, 0.0, 1.5])
    frequency = torch.tensor([0.0, 0.3, 1.0, -0.5, 2.0, 0.0])
    repetition = torch.tensor([1.3, 1.0, 0.7, 1.1, 2.0, 1.0])
    expected = vllm_penalties(logits, prompts, outputs, presence, frequency, repetition)
    for row in range(6):
        params = SamplingParams(
            presence_penalty=float(presence[row]), frequency_penalty=float(frequency[row]), repetition_penalty=float(repetition[row])
        )
        got = process_logits(logits[row], params, prompts[row], outputs[row], EOS)
        torch.testing.assert_close(got, expected[row])


def test_min_p_keeps_tokens_within_the_ratio_of_the_most_likely():
    probs = torch.tensor([0.5, 0.3, 0.1, 0.06, 0.04])
    # vLLM: keep p >= min_p * max p; here 0.2 * 0.5 = 0.1.
    kept = apply_min_p(probs, 0.2)
    assert kept.tolist() == pytest.approx([0.5 / 0.9, 0.3 / 0.9, 0.1 / 0.9, 0.0, 0.0])
    assert apply_min_p(probs, 0.0) is probs


def test_min_tokens_masks_eos_and_stop_tokens_until_reached():
    logits = torch.zeros(VOCAB)
    params = SamplingParams(min_tokens=3, stop_token_ids=(7,))
    masked = process_logits(logits, params, [1], [5, 6], EOS)
    assert masked[2] == float("-inf") and masked[7] == float("-inf") and torch.isfinite(masked[[0, 1, 3]]).all()
    assert torch.equal(process_logits(logits, params, [1], [5, 6, 8], EOS), logits)
    ignoring_eos = process_logits(logits, SamplingParams(min_tokens=3, ignore_eos=True), [1], [], EOS)
    assert torch.isfinite(ignoring_eos).all()  # with ignore_eos, EOS never stops a request anyway


def test_logit_bias_is_added_and_can_force_a_token():
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(1))
    biased = process_logits(logits, SamplingParams(logit_bias=((11, 100.0), (4, -2.5))), [], [], EOS)
    assert biased[11] == logits[11] + 100 and biased[4] == logits[4] - 2.5
    assert torch.equal(biased[[0, 1, 2]], logits[[0, 1, 2]])
    sampler = Sampler(EOS)
    forced = SamplingParams(temperature=1.0, seed=5, logit_bias=((11, 100.0),))
    history = [TokenHistory((), ())]
    assert {sampler.sample(logits[None] * 0.1, ["r"], [forced], history)[0] for _ in range(20)} == {11}


def test_greedy_with_processors_takes_the_argmax_of_the_processed_logits():
    logits = torch.tensor([[0.0, 5.0, 4.0, 1.0]])
    sampler = Sampler(frozenset())
    plain, penalised = SamplingParams(), SamplingParams(repetition_penalty=2.0)
    assert not plain.reads_logits and penalised.reads_logits
    assert sampler.sample(logits, ["a"], [plain], [TokenHistory((1,), ())]) == [1]
    assert sampler.sample(logits, ["a"], [penalised], [TokenHistory((1,), ())]) == [2]  # 5 / 2 < 4


def test_no_processors_leaves_the_logits_as_they_are():
    logits = torch.randn(VOCAB)
    assert process_logits(logits, SamplingParams(temperature=0.7, top_p=0.9), [1, 2], [3], EOS) is logits
