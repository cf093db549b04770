"""The engine's view of one request: prompt, multimodal features, sampling and progress."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from services.engine.detokenizer import DetokenizerState
from services.engine.pooler import PoolingTask, PoolState
from services.engine.sampling_params import PromptTokenLogprobs, SamplingParams
from services.models.lora.adapter import LoraAdapter
from shared.hashing import MmSpan, extend_block_hashes
from shared.types import BlockHash, MmHash, PlaceholderRange


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def is_finished(self) -> bool:
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH, RequestStatus.FINISHED_ABORTED)


@dataclass(slots=True)
class MmFeature:
    """One image: identity, placeholder span, and the pixels to encode on an encoder-cache miss."""

    mm_hash: MmHash
    placeholder: PlaceholderRange
    grid_thw: tuple[int, int, int]
    pixel_values: torch.Tensor | None

    @property
    def num_embeds(self) -> int:
        return self.placeholder.length


@dataclass(slots=True, eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    mrope_positions: torch.Tensor  # (3, num_prompt_tokens)
    mrope_delta: int
    mm_features: list[MmFeature] = field(default_factory=list)
    cache_salt: str | None = None
    lora: LoraAdapter | None = None  # its adapter, whose fingerprint keys every block it computes
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    # Prompt tokens served from the prefix cache when the request was first scheduled.
    num_cached_tokens: int | None = None
    status: RequestStatus = RequestStatus.WAITING
    block_hashes: list[BlockHash] = field(default_factory=list)
    num_preemptions: int = 0
    output_text: str = ""
    detokenizer: DetokenizerState = field(default_factory=DetokenizerState)  # output_processor.py's
    arrival_s: float = field(default_factory=time.monotonic)  # when this node built the request
    first_scheduled_s: float | None = None  # its first engine step: arrival to this is its queue time
    # The item computed elsewhere whose embeddings the scheduler last stopped before, not yet
    # imported (services/prefill/embedding_feed.py brings it); None while nothing is awaited.
    awaiting_import: MmHash | None = None
    # Entry i: prompt token i + 1's logprobs, filled while the prompt is computed, when the
    # sampling asks for them (prompt_logprobs.py).
    prompt_logprobs: list[PromptTokenLogprobs] = field(default_factory=list)
    # An embedding request (pooler.py): it ends at its prompt's last token with an embedding,
    # never sampling. ``pool_state`` gathers the rows CLS and MEAN pooling read.
    pooling: PoolingTask | None = None
    pool_state: PoolState | None = None

    @property
    def computes_whole_prompt(self) -> bool:
        """It reads hidden states of every prompt position, which a cached prefix never kept:
        prompt logprobs, or CLS / MEAN pooling."""
        return self.sampling.prompt_logprobs is not None or (self.pooling is not None and self.pooling.reads_every_row)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def lora_id(self) -> str | None:
        """Its adapter's content fingerprint: the "lora" key of its block hashes (shared/hashing.py)."""
        return None if self.lora is None else self.lora.fingerprint

    def update_block_hashes(self, block_size: int) -> list[BlockHash]:
        """Extend block_hashes to cover every full block of the current tokens."""
        if len(self.block_hashes) < self.num_tokens // block_size:
            spans = [MmSpan(f.mm_hash, f.placeholder) for f in self.mm_features]
            self.block_hashes = extend_block_hashes(
                self.block_hashes, self.token_ids(), block_size, spans, cache_salt=self.cache_salt, lora_name=self.lora_id
            )
        return self.block_hashes

    def positions(self, start: int, end: int) -> torch.Tensor:
        """(3, end - start) M-RoPE positions of tokens [start, end); generated tokens continue at
        index + mrope_delta on all three axes."""
        prompt_len = self.num_prompt_tokens
        parts = []
        if start < prompt_len:
            parts.append(self.mrope_positions[:, start : min(end, prompt_len)])
        if end > prompt_len:
            tail = torch.tensor(self.generated_positions(max(start, prompt_len), end), dtype=torch.long)
            parts.append(tail.expand(3, -1))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def generated_positions(self, start: int, end: int) -> range:
        """The position, the same on all three axes, of each generated token in [start, end)
        (``start`` at or past the prompt's end): its index + mrope_delta."""
        return range(start + self.mrope_delta, end + self.mrope_delta)
