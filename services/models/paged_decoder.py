"""What every family's text decoder shares: the vocabulary matrix (LM head, and with tied
embeddings the embedding table), its CPU packing, and greedy or raced tokens without full logits.

A family's decoder subclasses ``PagedDecoder``, builds ``self.layers`` and implements
``forward(inputs, positions, layer_kv, backend) -> hidden`` (layer_kv: per layer, its KV storage
and its planned AttentionBatch: services/engine/attention_inputs.py); the model runner calls only
``prepare_inputs``, ``forward``, ``compute_logits``, ``argmax_tokens`` and ``pack_for_cpu``.

An image's encoder output is one tensor of rows, one row per placeholder token. Its first
``hidden_size`` columns replace the token embeddings; a family whose tower feeds more than the
input layer (Qwen3-VL's DeepStack) appends those features as further columns and reads them from
``DecoderInputs.image_features`` in its layers. So caches, the wire and budgets carry an image's
output whole, whatever the family.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kernels.cpu_linear import pack_linears
from kernels.lm_head import ChunkedLmHead
from kernels.race import Race
from kernels.screened_argmax import ScreenedArgmax, screening_available


@dataclass(slots=True)
class DecoderInputs:
    embeds: torch.Tensor  # (N, hidden): token embeddings with image rows merged in
    # (N, width) rows of the step's image tokens as the encoder produced them, and (N,) where they
    # are: only for families whose layers read more than the merged embeddings.
    image_features: torch.Tensor | None = None
    image_mask: torch.Tensor | None = None


class PagedDecoder(nn.Module):
    # Families whose layers read image features beyond the input embeddings set this.
    keeps_image_features = False

    def __init__(self, vocab_size: int, hidden_size: int, *, tie_word_embeddings: bool) -> None:
        super().__init__()
        self.tie_word_embeddings = tie_word_embeddings
        # The vocabulary matrix [vocab, hidden], stored once: the LM head, and with tied embeddings
        # the embedding table too (a row gather). Kept in this layout, not transposed, so that the
        # screened argmax (kernels/screened_argmax.py) gathers its candidate tokens as rows.
        self.lm_head_weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)
        self.embed_tokens: nn.Embedding | None = None
        self.lm_head: ChunkedLmHead | None = None  # set by pack_for_cpu
        self.screened_head: ScreenedArgmax | None = None  # set by pack_for_cpu
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
        greedy and raced tokens at half the reading (kernels/screened_argmax.py)."""
        pack_linears(self.layers)
        self.lm_head = ChunkedLmHead(self.lm_head_weight.detach())
        if screen_greedy and screening_available():
            self.screened_head = ScreenedArgmax(self.lm_head_weight.detach(), float32_logits=self.lm_head)
            self.screened_head.calibrate(self.lm_head.argmax)

    def prepare_inputs(self, token_ids: torch.Tensor, merges: list[tuple[int, torch.Tensor]]) -> DecoderInputs:
        """Embed ``token_ids`` and merge each (first row, image rows) in ``merges``."""
        embeds = self.embed(token_ids)
        hidden = embeds.shape[1]
        features = mask = None
        if self.keeps_image_features and merges:
            features = embeds.new_zeros(embeds.shape[0], merges[0][1].shape[1])
            mask = torch.zeros(embeds.shape[0], dtype=torch.bool, device=embeds.device)
        for row, rows in merges:
            embeds[row : row + rows.shape[0]] = rows[:, :hidden].to(embeds.dtype)
            if features is not None:
                features[row : row + rows.shape[0]] = rows.to(embeds.dtype)
                mask[row : row + rows.shape[0]] = True
        return DecoderInputs(embeds, features, mask)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.embed_tokens is not None:
            return self.embed_tokens(token_ids)
        return F.embedding(token_ids, self.lm_head_weight)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is not None:
            return self.lm_head(hidden).float()
        return F.linear(hidden, self.lm_head_weight).float()

    def argmax_tokens(self, hidden: torch.Tensor, allowed: torch.Tensor | None = None, race: Race | None = None) -> list[int]:
        """Each row's token: the argmax of its logits, or with ``race`` of its race scores
        (kernels/race.py), among its ``allowed`` tokens ([N, V] bool) when given; without the
        logits where the screen is on."""
        tokens = self.screened_head.argmax_or_none(hidden, allowed, race) if self.screened_head is not None else None
        if tokens is not None:
            return tokens
        if allowed is None and race is None and self.lm_head is not None:
            return self.lm_head.argmax(hidden)
        scores = self.compute_logits(hidden)
        if race is not None:
            scores = race.scores(scores)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        return scores.argmax(dim=-1).tolist()
