"""The Gated DeltaNet's two forms against transformers' own torch functions, and against each
other: a run cut anywhere, from any state, ends where the whole run ends."""

from __future__ import annotations

import pytest
import torch

from kernels.gated_delta import chunked_delta_rule, recurrent_step


def _inputs(length: int, heads: int = 4, key_dim: int = 16, value_dim: int = 8, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    q, k = (torch.nn.functional.normalize(rand(length, heads, key_dim), dim=-1) for _ in range(2))
    v = rand(length, heads, value_dim)
    g = -torch.nn.functional.softplus(rand(length, heads))
    beta = torch.sigmoid(rand(length, heads))
    state = rand(heads, key_dim, value_dim) * 0.1
    return q * key_dim**-0.5, k, v, g, beta, state


@pytest.mark.parametrize("length", [1, 5, 64, 100, 130])
def test_the_chunked_form_is_transformers_from_any_state(length):
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

    q, k, v, g, beta, state = _inputs(length)
    out, final = chunked_delta_rule(q, k, v, g, beta, state.clone())
    # Transformers' takes q unscaled and scales it itself; (batch, length, heads, dim).
    ref_out, ref_final = torch_chunk_gated_delta_rule(
        (q * 16**0.5)[None], k[None], v[None], g[None], beta[None], initial_state=state[None].clone(), output_final_state=True
    )
    torch.testing.assert_close(out, ref_out[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(final, ref_final[0], rtol=0, atol=1e-5)


def test_single_steps_are_transformers_recurrence_and_agree_with_the_chunked_form():
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

    q, k, v, g, beta, state = _inputs(9, seed=3)
    stepped, outs = state[None].clone(), []
    for t in range(9):
        out, stepped = recurrent_step(q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1], stepped)
        outs.append(out[0])
    ref_out, ref_final = torch_recurrent_gated_delta_rule(
        (q * 16**0.5)[None], k[None], v[None], g[None], beta[None], initial_state=state[None].clone(), output_final_state=True
    )
    torch.testing.assert_close(torch.stack(outs), ref_out[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(stepped[0], ref_final[0], rtol=0, atol=1e-6)
    chunked_out, chunked_final = chunked_delta_rule(q, k, v, g, beta, state.clone())
    torch.testing.assert_close(chunked_out, torch.stack(outs), rtol=0, atol=1e-5)
    torch.testing.assert_close(chunked_final, stepped[0], rtol=0, atol=1e-5)


def test_a_run_cut_in_two_ends_where_the_whole_run_ends():
    q, k, v, g, beta, state = _inputs(150, seed=5)
    whole_out, whole_final = chunked_delta_rule(q, k, v, g, beta, state.clone())
    first_out, middle = chunked_delta_rule(q[:37], k[:37], v[:37], g[:37], beta[:37], state.clone())
    second_out, final = chunked_delta_rule(q[37:], k[37:], v[37:], g[37:], beta[37:], middle)
    torch.testing.assert_close(torch.cat([first_out, second_out]), whole_out, rtol=0, atol=1e-5)
    torch.testing.assert_close(final, whole_final, rtol=0, atol=1e-5)
