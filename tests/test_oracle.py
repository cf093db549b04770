"""The oracle's comparison rule: exact ids, or a first divergence at a genuine tie."""

from __future__ import annotations

import pytest
import torch

from tests.oracle import OracleOutput, assert_tokens_match


def _output(tokens, margins):
    logits = []
    for token, margin in zip(tokens, margins):
        row = torch.zeros(8)
        row[token] = 10.0
        row[(token + 1) % 8] = 10.0 - margin
        logits.append(row)
    return OracleOutput(token_ids=list(tokens), step_logits=logits)


def test_equal_tokens_pass():
    assert_tokens_match([1, 2, 3], _output([1, 2, 3], [5, 5, 5]))


def test_divergence_without_tie_fails():
    with pytest.raises(AssertionError, match="diverged from the oracle at step 1"):
        assert_tokens_match([1, 4, 3], _output([1, 2, 3], [5, 5, 5]))


def test_divergence_at_a_tie_passes():
    assert_tokens_match([1, 3, 0], _output([1, 2, 3], [5, 5e-5, 5]))


def test_length_mismatch_fails():
    with pytest.raises(AssertionError, match="length"):
        assert_tokens_match([1, 2], _output([1, 2, 3], [5, 5, 5]))


def test_logprobs_are_per_step(oracle):
    out = _output([1, 2], [5, 5])
    assert len(out.logprobs()) == 2 and all(lp <= 0 for lp in out.logprobs())
