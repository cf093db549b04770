"""One decode as plain data: what the servicer hands the node (DecodeJob). The node sees neither
protobuf nor gRPC; server.py converts at the edges."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.engine.remote_request import PositionsFn, PromptItem, build_request
from services.engine.request import Request
from services.engine.sampling_params import SamplingParams, TokenLogprobs
from services.models.lora.adapter import LoraAdapter
from shared.types import LoraRef


@dataclass(frozen=True, slots=True)
class DecodeJob:
    request_id: str
    prompt_token_ids: Sequence[int]
    items: Sequence[PromptItem]
    sampling: SamplingParams
    first_token_id: int  # sampled by the prefill node
    first_token_logprobs: TokenLogprobs | None = None
    num_cached_tokens: int = 0  # what the client is told of the prompt's prefix hit
    cache_salt: str | None = None
    prior_output_token_ids: Sequence[int] = ()  # a migrated request's answer so far
    every_output: bool = True  # stream each step's output; False: only the last (a non-streamed request)
    lora: LoraRef | None = None  # its LoRA adapter; None: the base model

    def engine_request(self, positions: PositionsFn, lora: LoraAdapter | None = None) -> Request:
        """``lora``: the node's adapter for self.lora (NodeAdapters.resolve)."""
        items, salt = list(self.items), self.cache_salt
        request = build_request(self.request_id, list(self.prompt_token_ids), items, self.sampling, salt, positions, lora)
        request.num_cached_tokens = self.num_cached_tokens
        request.output_token_ids = list(self.prior_output_token_ids)
        return request


class DecodeFailedError(RuntimeError):
    """The engine failed the request after adopting it."""
