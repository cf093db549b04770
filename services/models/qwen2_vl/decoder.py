"""Our Qwen2-VL / Qwen2.5-VL text decoder over a paged KV cache.

Per layer:  h = x + o_proj(attn(rope(q_proj(rms(x))), rope(k_proj(rms(x))), v_proj(rms(x))))
            y = h + down(silu(gate(rms(h))) * up(rms(h)))
M-RoPE: the head_dim/2 rotary frequencies are split into mrope_section (t, h, w) chunks; chunk i
rotates by the token's position on axis i. cos/sin are then duplicated across the two halves
(rotate_half convention), as in Qwen2-VL.
Tokens from all scheduled requests are packed into one [num_tokens, hidden] batch; attention is
the only per-request operation and goes through the attention backend.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.attention import AttentionBackend, AttentionBatch
from kernels.cpu_linear import pack_linears
from kernels.lm_head import ChunkedLmHead
from kernels.screened_argmax import ScreenedArgmax, screening_available
from services.models.qwen2_vl.config import TextConfig


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class MRotaryEmbedding(nn.Module):
    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        dim = config.head_dim
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        if sum(config.mrope_section) != dim // 2:
            raise ValueError(f"mrope_section {config.mrope_section} must sum to head_dim/2 = {dim // 2}")
        self.mrope_section = list(config.mrope_section)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (3, N) -> cos, sin of shape (N, head_dim)."""
        freqs = positions[..., None].float() * self.inv_freq  # (3, N, dim/2)
        chunks = freqs.split(self.mrope_section, dim=-1)
        freqs = torch.cat([chunk[i % 3] for i, chunk in enumerate(chunks)], dim=-1)  # (N, dim/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (N, heads, head_dim); cos/sin (N, head_dim)."""
    cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=True)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=True)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        self.scale = self.head_dim**-0.5

    def forward(self, x, cos, sin, kv_cache, batch: AttentionBatch, backend: AttentionBackend) -> torch.Tensor:
        n = x.shape[0]
        q = apply_rope(self.q_proj(x).view(n, self.num_heads, self.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(n, self.num_kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = kv_cache
        backend.write_kv(k_cache, v_cache, k, v, batch)
        out = backend.attend(q, k_cache, v_cache, batch, self.scale)
        return self.o_proj(out.reshape(n, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, kv_cache, batch, backend) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, batch, backend)
        return x + self.mlp(self.post_attention_layernorm(x))


class TextDecoder(nn.Module):
    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = MRotaryEmbedding(config)
        # The vocabulary matrix [vocab, hidden], stored once: the LM head, and with tied embeddings
        # the embedding table too (a row gather). Kept in this layout, not transposed, so that the
        # screened argmax (kernels/screened_argmax.py) gathers its candidate tokens as rows.
        self.lm_head_weight = nn.Parameter(torch.empty(config.vocab_size, config.hidden_size), requires_grad=False)
        self.embed_tokens: nn.Embedding | None = None
        self.lm_head: ChunkedLmHead | None = None  # set by pack_for_cpu
        self.greedy_head: ScreenedArgmax | None = None  # set by pack_for_cpu
        if not config.tie_word_embeddings:
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        state = dict(weights)
        embed = state.pop("embed_tokens.weight")
        head = state.pop("lm_head.weight", None)
        if head is None and not self.config.tie_word_embeddings:
            raise ValueError("checkpoint has no lm_head.weight and does not tie embeddings")
        state["lm_head_weight"] = embed if self.config.tie_word_embeddings or head is None else head
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

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        batch: AttentionBatch,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        """inputs_embeds (N, hidden), positions (3, N) -> final hidden states (N, hidden)."""
        cos, sin = self.rotary(positions)
        backend.prepare(batch, num_heads=self.config.num_heads, num_kv_heads=self.config.num_kv_heads, head_dim=self.config.head_dim)
        x = inputs_embeds
        for layer, kv_cache in zip(self.layers, kv_caches):
            x = layer(x, cos, sin, kv_cache, batch, backend)
        return self.norm(x)

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
