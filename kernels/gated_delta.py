"""The Gated DeltaNet's recurrence (Qwen3.5's linear attention) in its two forms, and what a
step's state layers read: StateBatch.

Per token t and value head (q, k l2-normalised, q scaled by 1/sqrt(key_dim), in float32):
  S <- exp(g_t) * S                           g_t <= 0: the decay
  S <- S + k_t (beta_t * (v_t - S^T k_t))^T   beta_t in (0, 1): the delta rule's step size
  o_t = S^T q_t
S is (key_dim, value_dim) per head.

A run of tokens takes the chunked form: within blocks of CHUNK tokens, the delta updates form a
unit lower-triangular system (I + A) U = beta V - beta exp(G) K S0, solved at once; the output is
the old state's read plus a causal, decay-weighted attention over the block's corrections U, and
the state moves to the block's end in one product. A single token takes the recurrence directly,
batched over requests. Both do the arithmetic transformers' torch fallback does for the same cases
(chunks of 64, the same triangular solve, the same products), so float32 results agree with the
oracle to rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

CHUNK = 64  # transformers' chunk size: results then sum as the oracle's do


@dataclass(frozen=True, slots=True)
class StateRun:
    """One scheduled request's rows in the step's packed batch, and its state slot."""

    first_row: int
    num_rows: int
    slot: int


@dataclass(frozen=True, slots=True)
class StateBatch:
    """What every state layer reads in one step: the runs of more than one token (a prompt chunk,
    computed by the chunked form), and the single-token rows (decode), gathered so that one
    recurrent update serves them all."""

    chunks: list[StateRun]
    single_rows: torch.Tensor  # (n,) rows in the batch
    single_slots: torch.Tensor  # (n,) their slots

    @classmethod
    def of(cls, runs: list[StateRun], device: torch.device) -> StateBatch:
        singles = [run for run in runs if run.num_rows == 1]
        return cls(
            chunks=[run for run in runs if run.num_rows > 1],
            single_rows=torch.tensor([run.first_row for run in singles], dtype=torch.long, device=device),
            single_slots=torch.tensor([run.slot for run in singles], dtype=torch.long, device=device),
        )


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


def chunked_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One request's run of L tokens from ``state`` (H, Dk, Dv). q, k (L, H, Dk) already
    normalised and scaled, v (L, H, Dv), g and beta (L, H), all float32. Returns (outputs
    (L, H, Dv), the state after the run)."""
    length = q.shape[0]
    pad = (CHUNK - length % CHUNK) % CHUNK
    # Heads first, the sequence padded to whole blocks: padded tokens have beta 0 and g 0, so they
    # write nothing and decay nothing.
    q, k, v = (F.pad(x.transpose(0, 1), (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x.transpose(0, 1), (0, pad)) for x in (g, beta))
    heads, blocks = q.shape[0], (length + pad) // CHUNK
    q, k, v = (x.reshape(heads, blocks, CHUNK, x.shape[-1]) for x in (q, k, v))
    g, beta = g.reshape(heads, blocks, CHUNK), beta.reshape(heads, blocks, CHUNK)
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]

    decay = g.cumsum(dim=-1)  # log of the decay from the block's start to each token
    future = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).triu(1)
    # exp(decay_i - decay_j) for j <= i, 0 above the diagonal.
    pair = (decay[..., :, None] - decay[..., None, :]).masked_fill(future, float("-inf")).exp()
    system = (k_beta @ k.transpose(-1, -2)) * pair  # its diagonal is ignored: the system is unit triangular
    within = (q @ k.transpose(-1, -2)) * pair
    corrections = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    reads = torch.linalg.solve_triangular(system, k_beta * decay.exp()[..., None], upper=False, unitriangular=True)

    q_decayed = q * decay.exp()[..., None]
    k_to_end = k * (decay[..., -1:] - decay).exp()[..., None]
    block_decay = decay[..., -1].exp()[..., None, None]
    out = torch.zeros_like(corrections)
    for b in range(blocks):
        u = corrections[:, b] - reads[:, b] @ state  # what the state did not already predict
        out[:, b] = q_decayed[:, b] @ state + within[:, b] @ u
        state = state * block_decay[:, b] + k_to_end[:, b].transpose(-1, -2) @ u
    return out.reshape(heads, -1, out.shape[-1])[:, :length].transpose(0, 1), state


def recurrent_step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token for each of B requests: q, k (B, H, Dk), v (B, H, Dv), g and beta (B, H),
    state (B, H, Dk, Dv). Returns (outputs (B, H, Dv), the new states)."""
    state = state * g.exp()[..., None, None]
    predicted = (state * k[..., None]).sum(dim=-2)
    delta = (v - predicted) * beta[..., None]
    state = state + k[..., None] * delta[..., None, :]
    return (state * q[..., None]).sum(dim=-2), state
