"""Typed, validated engine configuration (CLI flags or ``TESSERA_ENGINE_<FIELD>`` variables)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from shared.settings import add_dataclass_arguments, dataclass_from_sources

ENV_PREFIX = "TESSERA_ENGINE_"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    block_size: int = 16
    # KV pool size: an explicit block count, or derived from a byte budget.
    num_kv_blocks: int | None = None
    kv_cache_bytes: int = 512 * 1024 * 1024
    max_num_seqs: int = 256  # as vLLM: a decode batch this wide amortizes the LM head over many streams
    # Token budget per step, shared by prefill chunks and decode tokens (chunked prefill).
    max_num_batched_tokens: int = 2048
    # Encoder cache budget in embedding rows, and how many rows the vision tower may produce per step.
    encoder_cache_tokens: int = 16384
    max_encoder_tokens_per_step: int = 16384
    # Never split one image's placeholder span across steps (as vLLM's disable_chunked_mm_input).
    disable_chunked_mm_input: bool = False
    enable_prefix_caching: bool = True
    # A hybrid model (Qwen3.5) saves its linear layers' state for prefix hits at the prompt's last
    # full block, within each image, and every this many tokens (a multiple of block_size).
    state_interval_tokens: int = 512
    # Sliding-window layers (Gemma3's local layers) hold only their window's KV pages, released to
    # the shared page pool as a request moves on (services/engine/kv/layout.py). Off: every layer
    # holds the whole context, as full attention would (attention stays windowed either way).
    sliding_window_kv: bool = True
    max_model_len: int = 32768
    attention_backend: str = "auto"
    # Prepack linear weights for oneDNN on CPU (kernels/cpu_linear.py): faster decode steps of a
    # few rows, at the cost of a second vocabulary matrix. Off: MKL sgemm, as transformers runs.
    prepack_weights: bool = True
    # Prepack the vision tower too (its linears, and its patch embedding as a linear product):
    # faster on CPU, but summed in another order than transformers' tower, so embeddings stop
    # being bitwise the oracle's and greedy tokens of image requests can differ from it
    # (docs/benchmarks.md, "A vision tower summed as transformers sums it"). Off: the tower runs
    # transformers' own arithmetic.
    prepack_vision: bool = False
    # With prepack_weights: greedy requests that ask for no logprobs, and requests sampled at a
    # temperature with nothing cut (kernels/race.py), take their token through a bfloat16 copy of
    # the LM head, checked exact against the float32 one (kernels/screened_argmax.py): half the
    # reading per step, half a vocabulary matrix more memory.
    screen_greedy: bool = True
    device: str = "cpu"
    # LoRA, with vLLM's flags and defaults: --enable-lora wraps the decoder's linear layers;
    # --lora-modules name=path ... (or vLLM's JSON form, '{"name": N, "path": P}') are the adapters
    # served; --max-loras of them in one batch, each of rank at most --max-lora-rank.
    enable_lora: bool = False
    lora_modules: tuple[str, ...] = ()
    max_loras: int = 1
    max_lora_rank: int = 16
    # Adapters held in memory by a node (vLLM's --max-cpu-loras; default max_loras): those past it
    # are read from their files again when a request names one.
    max_cpu_loras: int | None = None

    def __post_init__(self) -> None:
        for name in (
            "block_size",
            "kv_cache_bytes",
            "max_num_seqs",
            "max_num_batched_tokens",
            "encoder_cache_tokens",
            "max_encoder_tokens_per_step",
            "max_model_len",
            "state_interval_tokens",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_kv_blocks is not None and self.num_kv_blocks <= 0:
            raise ValueError("num_kv_blocks must be positive")
        if self.max_encoder_tokens_per_step > self.encoder_cache_tokens:
            raise ValueError("max_encoder_tokens_per_step cannot exceed encoder_cache_tokens")
        if self.state_interval_tokens % self.block_size:
            raise ValueError(f"state_interval_tokens ({self.state_interval_tokens}) must be a multiple of block_size ({self.block_size})")
        if self.max_loras <= 0 or self.max_lora_rank <= 0:
            raise ValueError(f"max_loras and max_lora_rank must be positive, got {self.max_loras}, {self.max_lora_rank}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be at least max_loras ({self.max_loras})")
        if self.lora_modules and not self.enable_lora:
            raise ValueError("--lora-modules needs --enable-lora")
        if self.attention_backend not in ("auto", "torch", "flashinfer"):
            raise ValueError(f"attention_backend must be auto, torch or flashinfer, got {self.attention_backend!r}")

    def resolve_num_kv_blocks(self, *, num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int, reserved_bytes: int = 0) -> int:
        """Pages of the KV pool: the count given, or what the byte budget holds after
        ``reserved_bytes`` (a hybrid model's state slots)."""
        if self.num_kv_blocks is not None:
            return self.num_kv_blocks
        bytes_per_block = 2 * num_layers * self.block_size * num_kv_heads * head_dim * dtype_bytes
        return max(1, (self.kv_cache_bytes - reserved_bytes) // bytes_per_block)

    def resolve_num_state_slots(self, bytes_per_request: int) -> tuple[int, int]:
        """A hybrid model's (state slots, state snapshots). Slots: one per sequence that may run,
        but at most half the KV budget (at least one). Snapshots, the states prefix hits restore:
        as many as slots, within a quarter of the budget. The attention layers' pages get the rest."""
        if self.num_kv_blocks is not None:
            return self.max_num_seqs, self.max_num_seqs if self.enable_prefix_caching else 0
        slots = max(1, min(self.max_num_seqs, (self.kv_cache_bytes // 2) // bytes_per_request))
        snapshots = min(self.max_num_seqs, (self.kv_cache_bytes // 4) // bytes_per_request) if self.enable_prefix_caching else 0
        return slots, snapshots

    @classmethod
    def add_cli_arguments(cls, parser: argparse.ArgumentParser) -> None:
        add_dataclass_arguments(parser, cls, "engine", spaced=frozenset({"lora_modules"}))

    @classmethod
    def from_sources(cls, args: argparse.Namespace | None = None, env: dict[str, str] | None = None, **overrides) -> EngineConfig:
        """CLI flags win over environment variables, which win over defaults."""
        return dataclass_from_sources(cls, ENV_PREFIX, args, env, **overrides)
