"""Encoder node: turns pixels into embeddings once per mm_hash and ships them to prefill nodes.

Per Encode call, for each item: cache hit -> ship; else take its pixels from the data-plane inbox
(the preprocess node pushed them, unless its sender-cache mirror said we already had them) ->
encode (batched) -> cache -> ship. Items with neither embeddings nor pixels are reported missing;
the caller resends pixels and retries. The cache is an EncoderCacheManager whose entries are
never referenced between calls, so eviction is LRU over whole items within a row budget.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from services.engine.encoder_cache_manager import EncoderCacheManager
from services.engine.model.checkpoint import load_config, load_weights
from services.engine.model.vision import VisionEncoder, build_vision_tower
from services.transport.tensor_channel import OPEN_CHANNEL, ChannelAuth, TensorInbox, TensorSender
from shared.cache_gauges import cache_gauges
from shared.compute_thread import ComputeThread
from shared.index.publisher import IndexPublisher
from shared.index.types import IndexEvents, MmEntry
from shared.liveness import Liveness
from shared.models.registry import ModelRef
from shared.types import MmHash

_OWNER = "encoder"


@dataclass(frozen=True, slots=True)
class EncodeItem:
    mm_hash: MmHash
    num_embeds: int
    grid_thw: tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class EncodeResult:
    missing_pixels: list[str]
    num_encoded: int
    num_cache_hits: int


class EncoderNode:
    def __init__(
        self,
        model: ModelRef,
        *,
        data_bind: str,
        cache_tokens: int,
        device: str = "cpu",
        pixel_wait_s: float = 2.0,
        publisher: IndexPublisher | None = None,
        liveness: Liveness | None = None,
        channel_auth: ChannelAuth = OPEN_CHANNEL,
    ) -> None:
        self.compute = ComputeThread("encoder-compute", liveness=liveness)  # builds the tower and runs every encode
        self.vision = self.compute.run(_build_vision, model, device)
        self.cache = EncoderCacheManager(cache_tokens)
        self.store: dict[MmHash, torch.Tensor] = {}
        self.inbox = TensorInbox(data_bind, auth=channel_auth)
        self.sender = TensorSender(auth=channel_auth)
        self.pixel_wait_s = pixel_wait_s
        self.num_cache_hits = 0
        self.publisher = publisher
        self._pending_lock = threading.Lock()
        self.num_pending = 0  # Encode calls queued or running: this node's load

    @property
    def data_address(self) -> str:
        return self.inbox.address

    def encode(self, items: list[EncodeItem], target_address: str) -> EncodeResult:
        with self._pending_lock:
            self.num_pending += 1
        try:
            return self.compute.run(self._encode, items, target_address)
        finally:
            with self._pending_lock:
                self.num_pending -= 1

    def load(self) -> tuple[float, float]:
        """(calls queued or running, 0: no KV pool), for heartbeats."""
        return float(self.num_pending), 0.0

    def _encode(self, items: list[EncodeItem], target_address: str) -> EncodeResult:
        # Runs only on the compute thread, one call at a time: no lock needed.
        ready: dict[str, torch.Tensor] = {}
        to_encode: list[tuple[EncodeItem, torch.Tensor]] = []
        missing: list[str] = []
        for item in items:
            if item.mm_hash in ready or any(e.mm_hash == item.mm_hash for e, _ in to_encode):
                continue
            if self.cache.check_and_update_cache(_OWNER, item.mm_hash):
                self.cache.free_encoder_input(_OWNER, item.mm_hash)  # refresh its LRU position
                ready[item.mm_hash] = self.store[item.mm_hash]
                self.num_cache_hits += 1
                continue
            message = self.inbox.wait(item.mm_hash, self.pixel_wait_s)
            if message is None:
                missing.append(item.mm_hash)
            else:
                to_encode.append((item, message.tensors["pixel_values"]))
        if to_encode:
            outputs = self.vision.encode([p for _, p in to_encode], [i.grid_thw for i, _ in to_encode])
            for (item, _), embeds in zip(to_encode, outputs):
                ready[item.mm_hash] = embeds
                self._cache(item.mm_hash, embeds, item.grid_thw)
        for mm_hash, embeds in ready.items():
            self.sender.send(target_address, mm_hash, {"embeds": embeds}, {"rows": embeds.shape[0]})
        return EncodeResult(missing, len(to_encode), len(items) - len(to_encode) - len(missing))

    def _cache(self, mm_hash: MmHash, embeds: torch.Tensor, grid_thw: tuple[int, int, int]) -> None:
        if not self.cache.can_allocate(embeds.shape[0]):
            return  # larger than the whole budget: serve it uncached
        self.cache.allocate(_OWNER, mm_hash, embeds.shape[0])
        self.cache.free_encoder_input(_OWNER, mm_hash)
        self.store[mm_hash] = embeds
        evicted = self.cache.drain_evicted()
        for evicted_hash in evicted:
            self.store.pop(evicted_hash, None)
        if self.publisher is not None:
            entry = MmEntry(embeds.shape[0], grid_thw, embeds.numel() * embeds.element_size())
            self.publisher.record(IndexEvents(mm_stored={mm_hash: entry}, mm_evicted=evicted))

    def counters(self) -> dict[str, float]:
        return {
            "encoder_items_encoded_total": float(self.vision.num_items_encoded),
            "encoder_cache_hits_total": float(self.num_cache_hits),
            "encoder_cache_rows": float(self.cache.cache_size - self.cache.num_free_slots),
            "encoder_embedding_bytes_sent_total": float(self.sender.num_bytes_sent),
            **self.inbox.counters(),
            **cache_gauges("encoder", "rows", self.cache.cache_size - self.cache.num_free_slots, self.cache.cache_size),
        }

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.stop()
        self.compute.close()
        self.inbox.close()
        self.sender.close()


def _build_vision(model: ModelRef, device: str) -> VisionEncoder:
    checkpoint = load_config(model.path)
    _, vision_weights = load_weights(model.path, torch.float32)
    merge = checkpoint.raw.get("vision_config", {}).get("spatial_merge_size", 2)
    return VisionEncoder(build_vision_tower(checkpoint, vision_weights, torch.float32, torch.device(device)), merge)
