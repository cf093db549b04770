"""An embedding request: a prefill that ends at its prompt's last token and returns a pooled
hidden state instead of sampling (vLLM's embed pooler on a generative checkpoint).

The rows pooled are the model's final hidden states, after its final norm (the rows the LM head
reads). LAST reads the last prompt row, which is always computed (a cached prefix stops one
token short of the prompt's end), so an embedding reuses prefix KV like any prompt. CLS and MEAN
read rows a cached prefix never kept, so such a request computes its whole prompt (as one that
asks for prompt logprobs does); MEAN sums its rows step by step, a chunk at a time. Then, as vLLM
does: the first ``dimensions`` values (Matryoshka), then L2 normalization when the checkpoint
pools that way. Float32 throughout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from services.models.pooling import PoolingKind


@dataclass(frozen=True, slots=True)
class PoolingTask:
    kind: PoolingKind = PoolingKind.LAST
    normalize: bool = True
    dimensions: int | None = None  # keep the first this many values (Matryoshka); None: all

    @property
    def reads_every_row(self) -> bool:
        return self.kind is not PoolingKind.LAST


@dataclass(slots=True)
class PoolState:
    """What a CLS or MEAN request has gathered of its prompt's rows so far."""

    first: torch.Tensor | None = None  # the row of prompt position 0
    total: torch.Tensor | None = None  # the sum of the rows of positions [0, num_rows)
    num_rows: int = 0

    def add(self, start: int, rows: torch.Tensor) -> None:
        """Rows of prompt positions [start, start + len(rows)). A range computed again (after a
        preemption, from position 0) starts over."""
        if start == 0:
            self.first, self.total, self.num_rows = None, None, 0
        if start != self.num_rows or rows.shape[0] == 0:
            return  # positions seen already: a preempted request recomputes from 0, caught above
        rows = rows.float()
        if self.first is None:
            self.first = rows[0].clone()
        chunk = rows.sum(dim=0)
        self.total = chunk if self.total is None else self.total + chunk
        self.num_rows += rows.shape[0]


def pool(task: PoolingTask, last_row: torch.Tensor, state: PoolState | None) -> list[float]:
    """The embedding of a request whose prompt is computed: ``last_row`` is its last prompt row."""
    if task.kind is PoolingKind.LAST:
        vector = last_row.float()
    else:
        assert state is not None and state.first is not None and state.total is not None, "a CLS/MEAN request saw every row"
        vector = state.first if task.kind is PoolingKind.CLS else state.total / state.num_rows
    if task.dimensions is not None:
        vector = vector[: task.dimensions]
    if task.normalize:
        vector = F.normalize(vector, p=2, dim=-1)
    return vector.cpu().tolist()
