"""Our Qwen3-VL text decoder over a paged KV cache.

Per layer (Qwen3: RMSNorm on each head's q and k before RoPE, no qkv bias by default):
  h = x + o_proj(attn(rope(q_norm(q_proj(n))), rope(k_norm(k_proj(n))), v_proj(n)))   n = rms(x)
  y = h + down(silu(gate(rms(h))) * up(rms(h)))
Interleaved M-RoPE: rotary frequency j (of head_dim/2) turns by the token's position on axis
  h  if j % 3 == 1 and j < 3 * section_h,
  w  if j % 3 == 2 and j < 3 * section_w,
  t  otherwise,
(transformers' Qwen3VLTextRotaryEmbedding.recomposition_frequencies), then cos/sin are duplicated
across the two halves (rotate_half convention). Only frequencies are selected, never combined, so
the float32 values are the oracle's bit for bit.
DeepStack: an image's encoder rows are [main | level 0 | ... | level L-1], each hidden_size wide.
The main part replaced the token embeddings (PagedDecoder.prepare_inputs); level i is added to the
residual stream at the image's rows after decoder layer i, as transformers' _deepstack_process
does. Rows are per token, so an image split across prefill chunks gets each chunk's share.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from kernels.attention import AttentionBackend, AttentionBatch
from services.models.layers import GatedMLP, PagedAttention, PreNormLayer, RMSNorm
from services.models.paged_decoder import DecoderInputs, PagedDecoder
from services.models.qwen3_vl.config import TextConfig


class InterleavedMRotaryEmbedding(nn.Module):
    """Over the leading ``dim`` of each head (all of it for Qwen3-VL, a part for Qwen3.5)."""

    def __init__(self, dim: int, rope_theta: float, mrope_section: tuple[int, int, int]) -> None:
        super().__init__()
        inv_freq = 1.0 / (rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        _, section_h, section_w = mrope_section
        j = torch.arange(dim // 2)
        axis = torch.zeros(dim // 2, dtype=torch.long)
        axis[(j % 3 == 1) & (j < 3 * section_h)] = 1
        axis[(j % 3 == 2) & (j < 3 * section_w)] = 2
        self.register_buffer("axis", axis, persistent=False)  # which position row each frequency reads

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (3, N) -> cos, sin of shape (N, head_dim)."""
        freqs = positions[..., None].float() * self.inv_freq  # (3, N, dim/2)
        index = self.axis.view(1, 1, -1).expand(1, freqs.shape[1], -1)
        freqs = freqs.gather(0, index)[0]  # (N, dim/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def _layer(config: TextConfig) -> PreNormLayer:
    heads = (config.num_heads, config.num_kv_heads, config.head_dim)
    norm = functools.partial(RMSNorm, eps=config.rms_norm_eps)
    bias = config.attention_bias
    attention = PagedAttention(config.hidden_size, *heads, qkv_bias=bias, o_bias=bias, scale=config.head_dim**-0.5, qk_norm=norm)
    return PreNormLayer(attention, GatedMLP(config.hidden_size, config.intermediate_size), config.hidden_size, config.rms_norm_eps)


class TextDecoder(PagedDecoder):
    keeps_image_features = True  # the DeepStack levels ride along after the main embedding columns

    def __init__(self, config: TextConfig) -> None:
        super().__init__(config.vocab_size, config.hidden_size, tie_word_embeddings=config.tie_word_embeddings)
        self.config = config
        self.layers = nn.ModuleList(_layer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = InterleavedMRotaryEmbedding(config.head_dim, config.rope_theta, config.mrope_section)

    def _deepstack_levels(self, inputs: DecoderInputs) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
        """(image rows of the batch, one (rows, hidden) tensor per DeepStack level), or (None, [])."""
        if inputs.image_features is None or inputs.image_mask is None:
            return None, []
        hidden, levels = self.config.hidden_size, self.config.num_deepstack_levels
        width = inputs.image_features.shape[1]
        if width != hidden * (1 + levels):
            raise ValueError(f"image rows are {width} wide; expected {hidden} x (1 + {levels} DeepStack levels)")
        rows = inputs.image_mask.nonzero().squeeze(1)
        if rows.numel() == 0:
            return None, []
        features = inputs.image_features[rows]
        return rows, [features[:, hidden * (1 + i) : hidden * (2 + i)] for i in range(levels)]

    def forward(
        self,
        inputs: DecoderInputs,
        positions: torch.Tensor,
        layer_kv: list[tuple[tuple[torch.Tensor, torch.Tensor], AttentionBatch]],
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """inputs.embeds (N, hidden), positions (3, N) -> final hidden states (N, hidden)."""
        cos, sin = self.rotary(positions)
        rows, levels = self._deepstack_levels(inputs)
        x = inputs.embeds
        for index, (layer, (kv_cache, batch)) in enumerate(zip(self.layers, layer_kv)):
            x = layer(x, cos, sin, kv_cache, batch, backend)
            if index < len(levels):
                x = x.index_put((rows,), x[rows] + levels[index].to(x.dtype))
        return self.norm(x)
