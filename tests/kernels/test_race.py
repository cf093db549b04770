"""The race samples softmax(logits / T): its winners' frequencies over many draws match the
probabilities, at a temperature that sharpens and one that flattens, and masked tokens never win."""

from __future__ import annotations

import pytest
import torch

from kernels.race import MAX_ABS_GUMBEL, Race, gumbel_from_uniform

NUM_DRAWS = 40_000


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_winners_follow_the_softmax(temperature):
    logits = torch.tensor([0.0, 1.0, 2.0, float("-inf"), -1.0])
    gumbel = gumbel_from_uniform(torch.rand(NUM_DRAWS, logits.numel(), generator=torch.Generator().manual_seed(3)))
    race = Race.build([temperature] * NUM_DRAWS, gumbel)
    winners = race.scores(logits.expand(NUM_DRAWS, -1)).argmax(dim=1)
    frequencies = torch.bincount(winners, minlength=logits.numel()).double() / NUM_DRAWS
    expected = torch.softmax(logits.double() / temperature, dim=0)
    # Four standard deviations of a frequency at 40,000 draws is under 0.01.
    assert torch.allclose(frequencies, expected, atol=0.01) and frequencies[3] == 0


def test_the_noise_of_float32_uniforms_stays_within_its_bound():
    """The extremes of a float32 uniform: 0 gives -inf (a token that cannot win); every other
    draw, the smallest denormal and the largest float below 1 included, stays within the bound
    the screened head relies on."""
    extremes = torch.tensor([0.0, 2.0**-149, 2.0**-24, 0.5, 1 - 2.0**-24])
    gumbel = gumbel_from_uniform(extremes.clone())
    assert gumbel[0] == float("-inf")
    assert bool((gumbel[1:].abs() <= MAX_ABS_GUMBEL).all()) and gumbel[-1] > 16.6 and gumbel[1] < -4.6
