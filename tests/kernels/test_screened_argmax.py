"""The screened argmax picks exactly the float32 argmax: on random heads, on near-ties finer than
bfloat16 can tell apart, on exact ties (the lowest id, as torch.argmax), and on rows it cannot
screen (NaN, flat logits), which it computes whole."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from kernels import screened_argmax
from kernels.race import Race, gumbel_from_uniform
from kernels.screened_argmax import ScreenedArgmax, screening_available

pytestmark = pytest.mark.skipif(not screening_available(), reason="this torch build has no oneDNN bfloat16 products")


def float32_argmax(hidden: torch.Tensor, weight: torch.Tensor) -> list[int]:
    return F.linear(hidden, weight).argmax(dim=-1).tolist()


@pytest.mark.parametrize("num_rows", [1, 3, 4, 16, 70])
def test_random_heads_give_the_float32_argmax(num_rows):
    torch.manual_seed(num_rows)
    weight = torch.randn(5000, 64) * 0.3
    hidden = torch.randn(num_rows, 64) * 3
    head = ScreenedArgmax(weight, max_rows=8)
    assert head.argmax(hidden) == float32_argmax(hidden, weight)
    assert head.num_rows_screened == num_rows and head.num_rows_unscreened == 0


def test_more_rows_than_it_is_worth_are_left_to_the_caller():
    weight = torch.randn(300, 16)
    head = ScreenedArgmax(weight, max_rows=4)
    assert head.argmax_or_none(torch.randn(5, 16)) is None and head.num_rows_screened == 0
    hidden = torch.randn(4, 16)
    assert head.argmax_or_none(hidden) == float32_argmax(hidden, weight)


def test_without_a_bound_every_width_is_screened():
    weight = torch.randn(300, 16)
    hidden = torch.randn(100, 16)
    assert ScreenedArgmax(weight).argmax_or_none(hidden) == float32_argmax(hidden, weight)


def test_calibration_times_the_rows_worth_screening():
    weight = torch.randn(20000, 256) * 0.1
    head = ScreenedArgmax(weight)
    head.calibrate(lambda hidden: float32_argmax(hidden, weight))
    assert head.max_rows in (0, *screened_argmax.TIMED_ROWS, None)
    assert head.num_rows_screened == 0  # the timing's rows are not counted


@pytest.fixture(params=[False, True], ids=["whole", "blocks of 16 tokens, pieces of 8 rows"])
def small_pieces(request, monkeypatch) -> bool:
    """With small pieces, every chunk holds several blocks and the rows run in several pieces."""
    if request.param:
        monkeypatch.setattr(screened_argmax, "SUB_BLOCK", 16)
        monkeypatch.setattr(screened_argmax, "MAX_PIECE_ROWS", 8)
    return request.param


@pytest.mark.parametrize("num_rows", [1, 5, 40])
def test_chunks_give_the_float32_argmax(num_rows, small_pieces):
    """A vocabulary of many chunks, the last one short: random rows, and near-ties and exact ties
    whose tokens sit in different chunks. With small pieces, every chunk holds several blocks (the
    short last one is one block) and the rows run in several pieces."""
    torch.manual_seed(10 + num_rows)
    weight = torch.randn(1000, 32) * 0.3
    hidden = torch.randn(num_rows, 32) * 3
    weight[130] = hidden[0] / hidden[0].norm() * 40  # chunk 1
    weight[900] = weight[130] * (1 + 2**-12)  # chunk 9 wins by a hair, finer than bfloat16
    if num_rows > 1:
        weight[[350, 720]] = hidden[1] / hidden[1].norm() * 50  # an exact tie across chunks 3 and 7
    head = ScreenedArgmax(weight, vocab_chunk=96)
    assert len(head.packed_chunks) == 11 and head.max_blocks_per_chunk == (6 if small_pieces else 1)
    expected = float32_argmax(hidden, weight)
    assert head.argmax(hidden) == expected and expected[0] == 900 and (num_rows == 1 or expected[1] == 350)
    assert head.num_rows_screened == num_rows
    allowed = torch.rand(num_rows, 1000) < 0.3
    allowed[0, 900] = False
    masked = F.linear(hidden, weight).masked_fill(~allowed, float("-inf")).argmax(dim=-1).tolist()
    assert head.argmax(hidden, allowed) == masked


@pytest.mark.parametrize("scale", [1e-30, 1.0, 10.0, 1e6])
def test_the_error_bound_holds_for_every_logit(scale):
    torch.manual_seed(0)
    weight, hidden = torch.randn(3000, 128), torch.randn(8, 128) * scale
    head = ScreenedArgmax(weight, max_rows=8)
    [packed] = head.packed_chunks
    approx = torch.ops.mkldnn._linear_pointwise(hidden.bfloat16(), packed, None, "none", [], "").float()
    exact = hidden.double() @ weight.double().t()
    bound = head.input_error(hidden, hidden.bfloat16()).unsqueeze(1) + screened_argmax.OUTPUT_ROUNDOFF * approx.abs()
    assert bool(((approx.double() - exact).abs() <= bound.double()).all())


def test_a_near_tie_finer_than_bfloat16_is_decided_in_float32():
    torch.manual_seed(1)
    weight = torch.randn(1000, 32)
    hidden = torch.randn(2, 32)
    for row, winner in ((0, 10), (1, 700)):
        # Two tokens whose weights differ below bfloat16's resolution; the later one wins by a hair.
        weight[winner - 5] = hidden[row] / hidden[row].norm() * 40
        weight[winner] = weight[winner - 5] * (1 + 2**-12)
    head = ScreenedArgmax(weight, max_rows=8)
    logits = F.linear(hidden, weight)
    assert 0 < logits[0, 10] - logits[0, 5] < 2**-8 * logits[0, 10]  # closer than bfloat16 resolves
    assert head.argmax(hidden) == float32_argmax(hidden, weight) == [10, 700]


def test_exact_ties_go_to_the_lowest_token_id():
    weight = torch.randn(500, 16)
    weight[[40, 300]] = weight[7] * 3
    hidden = weight[7].unsqueeze(0).clone()
    assert ScreenedArgmax(weight, max_rows=8).argmax(hidden) == float32_argmax(hidden, weight) == [40]


def test_rows_it_cannot_screen_are_computed_whole(monkeypatch):
    torch.manual_seed(2)
    weight = torch.randn(400, 16)
    hidden = torch.randn(3, 16)
    hidden[1, 4] = float("nan")
    head = ScreenedArgmax(weight, max_rows=8)
    assert head.argmax(hidden) == float32_argmax(hidden, weight)
    assert (head.num_rows_screened, head.num_rows_unscreened) == (2, 1)
    monkeypatch.setattr(screened_argmax, "MAX_CANDIDATES", 0)  # every row has too many
    flat = torch.randn(2, 16)
    assert head.argmax(flat) == float32_argmax(flat, weight)
    assert head.num_rows_unscreened == 3


def test_an_allowed_mask_gives_the_masked_float32_argmax():
    """A grammar's token mask: the best allowed token, exactly, and a row that allows nothing
    but one token gets that token."""
    torch.manual_seed(5)
    weight = torch.randn(5000, 64) * 0.3
    hidden = torch.randn(6, 64) * 3
    allowed = torch.rand(6, 5000) < 0.05
    allowed[5] = False
    allowed[5, 1234] = True
    head = ScreenedArgmax(weight, max_rows=8)
    expected = F.linear(hidden, weight).masked_fill(~allowed, float("-inf")).argmax(dim=-1).tolist()
    assert head.argmax(hidden, allowed) == expected and expected[5] == 1234


def float32_race(hidden: torch.Tensor, weight: torch.Tensor, race: Race, allowed: torch.Tensor | None = None) -> list[int]:
    scores = race.scores(F.linear(hidden, weight))
    return (scores if allowed is None else scores.masked_fill(~allowed, float("-inf"))).argmax(dim=-1).tolist()


def make_race(num_rows: int, vocab_size: int, seed: int) -> Race:
    """Gumbel noise at temperatures from 0.05 to 5; every fourth row greedy (temperature 1, no noise)."""
    generator = torch.Generator().manual_seed(seed)
    gumbel = gumbel_from_uniform(torch.rand(num_rows, vocab_size, generator=generator))
    gumbel[::4] = 0.0
    temperatures = [(1.0, 0.05, 0.7, 5.0)[row % 4] for row in range(num_rows)]
    return Race.build(temperatures, gumbel)


@pytest.mark.parametrize("num_rows", [1, 6, 40])
def test_races_give_the_float32_race_winner(num_rows, small_pieces):
    """Sampled rows: the token of the float32 race (logits / T + noise) for the same noise, in a
    vocabulary of many chunks, with and without a grammar's mask; a greedy row in the race gets
    the float32 argmax."""
    torch.manual_seed(20 + num_rows)
    weight = torch.randn(1000, 32) * 0.3
    hidden = torch.randn(num_rows, 32) * 3
    head = ScreenedArgmax(weight, vocab_chunk=96)
    race = make_race(num_rows, 1000, seed=num_rows)
    tokens = head.argmax(hidden, None, race)
    assert tokens == float32_race(hidden, weight, race)
    assert tokens[0] == float32_argmax(hidden[:1], weight)[0]
    assert head.num_rows_screened == num_rows and head.num_rows_unscreened == 0
    allowed = torch.rand(num_rows, 1000) < 0.3
    assert head.argmax(hidden, allowed, race) == float32_race(hidden, weight, race, allowed)


def test_a_race_the_bfloat16_scores_get_backwards_is_decided_in_float32():
    """Token 1500's weight is token 100's times 1 + 2^-12, finer than bfloat16 resolves, and its
    noise is lower by 0.03: the bfloat16 scores put 100 first, the float32 race 1500 (its logit is
    higher by about 0.07 / T). A token whose noise is -inf (a uniform draw of 0) never wins."""
    torch.manual_seed(6)
    weight = torch.randn(2000, 32)
    hidden = torch.randn(2, 32)
    weight[100] = hidden[0] / hidden[0].norm() * 40
    weight[1500] = weight[100] * (1 + 2**-12)
    weight[700] = hidden[1] / hidden[1].norm() * 80
    race = Race.build([0.8, 0.8], torch.zeros(2, 2000))
    race.gumbel[0, 100], race.gumbel[0, 1500] = 1.03, 1.0
    race.gumbel[1, 700] = float("-inf")
    head = ScreenedArgmax(weight, max_rows=8)
    [packed] = head.packed_chunks
    approx = torch.ops.mkldnn._linear_pointwise(hidden[:1].bfloat16(), packed, None, "none", [], "").float()
    approx_scores = approx[0, [100, 1500]] / 0.8 + race.gumbel[0, [100, 1500]]
    assert approx_scores[0] > approx_scores[1]  # the screen's own order is the wrong one
    tokens = head.argmax(hidden, None, race)
    assert tokens == float32_race(hidden, weight, race) and tokens[0] == 1500 and tokens[1] != 700
    assert head.num_rows_unscreened == 0


def test_a_race_row_it_cannot_screen_is_computed_whole():
    torch.manual_seed(7)
    weight, hidden = torch.randn(400, 16), torch.randn(3, 16)
    race = make_race(3, 400, seed=7)
    race.gumbel[2, 9] = float("inf")  # no finite threshold
    head = ScreenedArgmax(weight, max_rows=8)
    tokens = head.argmax(hidden, None, race)
    assert tokens == float32_race(hidden, weight, race) and tokens[2] == 9
    assert (head.num_rows_screened, head.num_rows_unscreened) == (2, 1)
