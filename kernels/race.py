"""Sampling as a race (the Gumbel-max trick, the exponential race vLLM's sampler runs):

    token = argmax_j (l_j / T + g_j),   g_j = -log(-log U_j),   U_j uniform on [0, 1)

draws token j with probability softmax(l / T)_j, and tokens masked to -inf never win. Every path
that samples computes the scores with ``race_scores`` (the sampler, the float32 head, the screened
head's float32 check: kernels/screened_argmax.py), one elementwise float32 division and one
addition, so that for a given draw of noise a request's token does not depend on the path.

The noise comes from float32 uniforms: U = 0 (probability 2^-24 per token) gives g = -inf, a
token that cannot win this step, and the largest g is -log(-log(1 - 2^-24)) ~ 16.64. Both bend the
distribution by about 1e-7, as vLLM's float32 exponentials do. Every finite g of a float32 U lies
in [-4.7, 16.7] (the smallest U, 2^-149, gives -log(103.3)), so MAX_ABS_GUMBEL bounds |g| without
reading the noise (kernels/screened_argmax.py needs that bound).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_ABS_GUMBEL = 17.0


def race_scores(logits: torch.Tensor, temperatures: torch.Tensor, gumbel: torch.Tensor) -> torch.Tensor:
    """logits / temperatures + gumbel in float32, elementwise (the shapes broadcast)."""
    return logits.float() / temperatures + gumbel


def gumbel_from_uniform(uniform: torch.Tensor) -> torch.Tensor:
    """-log(-log U), in place."""
    return uniform.log_().neg_().log_().neg_()


@dataclass(frozen=True, slots=True)
class Race:
    """The temperatures and noise of one step's sampled rows."""

    temperatures: torch.Tensor  # [N, 1] float32
    gumbel: torch.Tensor  # [N, V] float32, from gumbel_from_uniform (so |g| <= MAX_ABS_GUMBEL, or -inf)

    @classmethod
    def build(cls, temperatures: list[float], gumbel: torch.Tensor, device: torch.device | str = "cpu") -> Race:
        return cls(torch.tensor(temperatures, dtype=torch.float32, device=device)[:, None], gumbel.to(device))

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        """Every row's scores: logits [N, V]."""
        return race_scores(logits, self.temperatures, self.gumbel)
