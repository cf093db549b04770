"""What every family's text decoder shares: the vocabulary matrix (LM head, and with tied
embeddings the embedding table), its CPU packing, and greedy tokens without full logits.

A family's decoder subclasses ``PagedDecoder``, builds ``self.layers`` and implements
``forward(inputs_embeds, positions, kv_caches, batch, backend) -> hidden``; the model runner calls
only ``embed``, ``forward``, ``compute_logits``, ``greedy_tokens`` and ``pack_for_cpu``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.cpu_linear import pack_linears
from kernels.lm_head import ChunkedLmHead
from kernels.screened_argmax import ScreenedArgmax, screening_available


class PagedDecoder(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, *, tie_word_embeddings: bool) -> None:
        super().__init__()
        self.tie_word_embeddings = tie_word_embeddings
        # The vocabulary matrix [vocab, hidden], stored once: the LM head, and with tied embeddings
        # the embedding table too (a row gather). Kept in this layout, not transposed, so that the
        # screened argmax (kernels/screened_argmax.py) gathers its candidate tokens as rows.
        self.lm_head_weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)
        self.embed_tokens: nn.Embedding | None = None
        self.lm_head: ChunkedLmHead | None = None  # set by pack_for_cpu
        self.greedy_head: ScreenedArgmax | None = None  # set by pack_for_cpu
        if not tie_word_embeddings:
            self.embed_tokens = nn.Embedding(vocab_size, hidden_size)
        self.layers = nn.ModuleList()

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        state = dict(weights)
        embed = state.pop("embed_tokens.weight")
        head = state.pop("lm_head.weight", None)
        if head is None and not self.tie_word_embeddings:
            raise ValueError("checkpoint has no lm_head.weight and does not tie embeddings")
        state["lm_head_weight"] = embed if self.tie_word_embeddings or head is None else head
        if self.embed_tokens is not None:
            state["embed_tokens.weight"] = embed
        missing, unexpected = self.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"weight mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")

    def pack_for_cpu(self, *, screen_greedy: bool = True) -> None:
        """Prepack every linear weight for oneDNN (kernels/cpu_linear.py; the LM head in vocabulary
        chunks, kernels/lm_head.py): decode steps of several streams no longer repack the weights
        on every call. The plain head stays, for embedding lookups; the packed copy costs one
        more vocabulary matrix of memory. ``screen_greedy``: a bfloat16 copy too (half a matrix more), for
        greedy tokens at half the reading (kernels/screened_argmax.py)."""
        pack_linears(self.layers)
        self.lm_head = ChunkedLmHead(self.lm_head_weight.detach())
        if screen_greedy and screening_available():
            self.greedy_head = ScreenedArgmax(self.lm_head_weight.detach(), float32_logits=self.lm_head)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.embed_tokens is not None:
            return self.embed_tokens(token_ids)
        return F.embedding(token_ids, self.lm_head_weight)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is not None:
            return self.lm_head(hidden).float()
        return F.linear(hidden, self.lm_head_weight).float()

    def greedy_tokens(self, hidden: torch.Tensor) -> list[int]:
        """The argmax token of each row's logits, without the logits where the screen is on."""
        tokens = self.greedy_head.argmax_or_none(hidden) if self.greedy_head is not None else None
        if tokens is not None:
            return tokens
        if self.lm_head is not None:
            return self.lm_head.argmax(hidden)
        return self.compute_logits(hidden).argmax(dim=-1).tolist()
