"""One prefill as plain data: what the servicer hands the node (PrefillJob), what it gets back
(PrefillResult), and the calls to other nodes a prefill may make (Upstream). The node sees
neither protobuf nor gRPC; server.py converts at the edges and dials the other nodes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from services.engine.pooler import PoolingTask
from services.engine.remote_request import PositionsFn, PromptItem, build_request
from services.engine.request import Request
from services.engine.sampling_params import PromptTokenLogprobs, SamplingParams, TokenLogprobs
from services.models.lora.adapter import LoraAdapter
from services.prefill.kv_pull import KVSource
from services.transport.addresses import AdvertisedAddress
from shared.types import BlockHash, LoraRef, MmHash


@dataclass(frozen=True, slots=True)
class PrefillJob:
    request_id: str
    prompt_token_ids: Sequence[int]
    items: Sequence[PromptItem]
    sampling: SamplingParams
    decode_address: str  # the decode node's data address: the prompt's KV pages go there
    cache_salt: str | None = None
    prior_output_token_ids: Sequence[int] = ()  # a migrated request's answer so far
    encoder_address: str | None = None  # where lacking embeddings are fetched from
    image_to_source: Mapping[MmHash, str] = field(default_factory=dict)  # images another holder is asked for first
    local_encode: frozenset[MmHash] = frozenset()  # images the router chose this node to encode
    local_pixels_key_prefix: str = ""  # their pixels wait in the inbox under prefix + mm_hash
    kv_sources: Sequence[KVSource] = ()  # peers holding a prefix of the prompt's KV
    lora: LoraRef | None = None  # its LoRA adapter; None: the base model
    # When the caller stops waiting, in time.time() seconds (the Prefill call's gRPC deadline); the
    # encoder calls it makes get what is left of it. None: the caller set none.
    deadline_s: float | None = None
    # An embedding request (vLLM's /v1/embeddings): it ends at its prompt's end with an embedding
    # and never reaches a decode node; ``decode_address`` is empty. Its dimensions, if asked.
    embed: EmbedSpec | None = None

    def engine_request(self, positions: PositionsFn, lora: LoraAdapter | None = None, pooling: PoolingTask | None = None) -> Request:
        """``lora``: the node's adapter for self.lora (NodeAdapters.resolve); ``pooling``: an
        embedding request's (Engine.pooling_task of self.embed)."""
        # The answer so far is computed like prompt text (same positions) and counts toward
        # min_tokens, so a migrated request continues exactly as if it had never moved.
        num_prior = len(self.prior_output_token_ids)
        sampling = replace(self.sampling, min_tokens=max(0, self.sampling.min_tokens - num_prior))
        token_ids = [*self.prompt_token_ids, *self.prior_output_token_ids]
        request = build_request(self.request_id, token_ids, list(self.items), sampling, self.cache_salt, positions, lora)
        request.pooling = pooling
        return request


@dataclass(frozen=True, slots=True)
class EmbedSpec:
    dimensions: int | None = None  # keep the first this many values (Matryoshka models only)


@dataclass(frozen=True, slots=True)
class PrefillResult:
    first_token_id: int
    num_cached_tokens: int
    mrope_delta: int
    first_token_logprobs: TokenLogprobs | None = None
    num_pulled_tokens: int = 0  # prompt tokens whose KV came from a peer
    prompt_logprobs: Sequence[PromptTokenLogprobs] = ()  # when the sampling asked: prompt token i + 1's at i
    embedding: Sequence[float] | None = None  # an embedding request's; it samples no token (first_token_id 0)


class Upstream(Protocol):
    """The calls one prefill makes to other nodes. A failed encoder call raises whatever its
    transport raises: the servicer fails the request the way the encoder failed it."""

    async def encode(
        self,
        encoder: str,
        items: Sequence[PromptItem],
        target: AdvertisedAddress,
        deadline_s: float | None = None,
        lora: LoraRef | None = None,
    ) -> list[MmHash]:
        """Have the encoder push the embeddings of ``items`` to ``target``'s inbox (keyed by
        mm_hash); returns the images it lacks pixels for. ``deadline_s``: the request's deadline
        (time.time() seconds), the call's own. ``lora``: an adapter that changes the tower, which
        the encoder runs for them."""
        ...

    async def export_kv(
        self, peer: str, hashes: Sequence[BlockHash], target: AdvertisedAddress, transfer_id: str, timeout_s: float
    ) -> int | None:
        """Have the peer push its pages of the leading ``hashes`` to ``target`` under
        ``transfer_id``; returns how many blocks it sends, None if the peer could not be asked."""
        ...
