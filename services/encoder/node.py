"""Encoder node: turns pixels into embeddings once per mm_hash and ships them to prefill nodes.

Per batch of Encode calls (the servicer batches concurrent calls, services/encoder/batching.py):
on the event loop, await the pixels of every image the cache lacks from the data-plane inbox (the
preprocess node pushed them, unless its sender-cache mirror said we already had them); then, on
the compute thread, for each call's items: cache hit -> ship; else its pixels -> vision-tower
passes over every new image of the batch (one pass while they fit MAX_PASS_ROWS embedding rows;
a long clip's groups split over several) -> cache -> ship each call's embeddings to its target.
Batches run one at a time, so the cache the loop reads is the one the compute thread leaves.
Items with neither embeddings nor pixels are reported missing; the caller resends pixels and
retries. The cache is an EncoderCacheManager whose entries are never referenced between calls,
so eviction is LRU over whole items within a row budget. Items of a LoRA adapter that changes
the tower (their mm_hashes are its own) run in passes of their own, with its tower updates
(services/models/lora/tower.py); the node serves the adapters of --lora-modules and runtime
loads (services/engine/lora/node_adapters.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from services.encoder.batching import BatchMetrics
from services.encoder.calibration import measure_seconds_per_token
from services.encoder.tower_adapters import tower_adapters, tower_passes
from services.engine.config import EngineConfig
from services.engine.encoder_cache_manager import EncoderCacheManager
from services.models.checkpoint import COMPUTE_DTYPE, dtype_name, load_weights
from services.models.family import VisionEncoder
from services.models.lora.adapter import LoraAdapter
from services.models.registry import ModelRef
from services.transport.addresses import AdvertisedAddress
from services.transport.tensor_channel import OPEN_CHANNEL, ChannelAuth, InboxMetrics, TensorInbox, TensorSender
from shared.cache_gauges import CacheGauges, cache_gauges
from shared.compute_thread import ComputeThread
from shared.index.cluster_config import ClusterConfig
from shared.index.publisher import IndexPublisher
from shared.index.types import IndexEvents, MmEntry
from shared.liveness import Liveness
from shared.node_metrics import Counter, Gauge, counter, gauge
from shared.types import MmHash

log = logging.getLogger("tessera.encoder")

_OWNER = "encoder"

# Embedding rows per vision-tower pass: a bound on one pass's activations, far above one image.
MAX_PASS_ROWS = 16384


@dataclass(frozen=True, slots=True)
class EncodeItem:
    mm_hash: MmHash
    num_embeds: int
    grid_thw: tuple[int, int, int]
    adapter: LoraAdapter | None = None  # a LoRA adapter on the tower (its items' mm_hashes are its own)


@dataclass(slots=True)
class CallPlan:
    """One call's images within a batch: cache hits, images to encode, images lacking pixels."""

    hits: list[MmHash]
    encoding: list[MmHash]
    missing: list[str]
    ready: dict[MmHash, torch.Tensor]  # embeddings of the hits


@dataclass(frozen=True, slots=True)
class EncodeResult:
    missing_pixels: list[str]
    num_encoded: int
    num_cache_hits: int


@dataclass(slots=True)
class EncoderMetrics:
    inbox: InboxMetrics
    batching: BatchMetrics = field(default_factory=BatchMetrics)  # the servicer's batcher counts into it
    num_items_encoded: Counter = counter("encoder_items_encoded_total", "Images run through the vision tower")
    tower_seconds: Counter = counter("encoder_tower_seconds_total", "Seconds the vision tower ran")
    # The embedding cache, in images: a miss is an image encoded.
    num_cache_hits: Counter = counter("encoder_cache_hits_total", "Images whose embeddings were cached")
    cache_misses: Counter = counter("encoder_cache_misses_total", "Images encoded (encoder_items_encoded_total)")
    num_cache_evictions: Counter = counter("encoder_cache_evictions_total", "Images' embeddings evicted from the cache")
    cache: CacheGauges = cache_gauges("encoder", "rows")
    cache_rows: Gauge = gauge("encoder_cache_rows", "Embedding rows cached (encoder_cache_used_rows)")
    num_embedding_bytes_sent: Counter = counter("encoder_embedding_bytes_sent_total", "Bytes of embeddings sent to prefill nodes")
    lora_adapters: Gauge = gauge("lora_adapters_served", "LoRA adapters this node serves (--lora-modules and runtime loads)")
    lora_bytes: Gauge = gauge("lora_adapter_bytes", "Bytes of the LoRA adapters' weights this node holds in memory")
    tower_seconds_per_token: Gauge = gauge(
        "encoder_tower_seconds_per_token",
        "The vision tower's seconds per embedding row, measured after start-up; 0 until then",
    )

    def __post_init__(self) -> None:
        self.cache_misses.read_from(lambda: self.num_items_encoded.value)


class EncoderNode:
    def __init__(
        self,
        model: ModelRef,
        *,
        data_bind: str,
        advertise_host: str | None = None,
        cache_tokens: int,
        device: str = "cpu",
        prepack: bool = False,
        pixel_wait_s: float = 2.0,
        max_pass_rows: int = MAX_PASS_ROWS,
        publisher: IndexPublisher | None = None,
        liveness: Liveness | None = None,
        channel_auth: ChannelAuth = OPEN_CHANNEL,
        calibrate: bool = True,
        lora: EngineConfig | None = None,
    ) -> None:
        """``lora``: the LoRA settings (--enable-lora, --lora-modules, --max-loras, ...)."""
        self.compute = ComputeThread("encoder-compute", liveness=liveness)  # builds the tower and runs every encode
        self.vision = self.compute.run(_build_vision, model, device, prepack)
        self.tower_loras, self.adapters = tower_adapters(model, self.vision, self.compute, lora, device, self._adapters_changed)
        # The tower's rate is measured on the compute thread after start-up, not before serving:
        # it runs ahead of the first encode, which it warms up, and reads 0 (unknown to the
        # gateway's media budget) until then.
        self.seconds_per_token = 0.0
        self.calibrated: Future | None = self.compute.submit(self._calibrate, model) if calibrate else None
        self.cache = EncoderCacheManager(cache_tokens)
        self.store: dict[MmHash, torch.Tensor] = {}
        self.inbox = TensorInbox(data_bind, advertise_host=advertise_host, auth=channel_auth)
        self.sender = TensorSender(auth=channel_auth)
        self.pixel_wait_s = pixel_wait_s
        self.publisher = publisher
        self.num_pending = 0  # Encode calls queued or running: this node's load
        self.num_batches = 0  # vision-tower passes
        # Traffic's tower work, counted here rather than by the tower, which the rate's
        # measurement also runs (on the compute thread, while metrics may be read).
        self.num_items_encoded = 0
        self.tower_seconds = 0.0
        self.max_pass_rows = max_pass_rows
        self.metrics = self._metrics()

    def _adapters_changed(self) -> None:
        if self.publisher is not None:
            self.publisher.record_changed()

    def _calibrate(self, model: ModelRef) -> None:
        try:
            self.seconds_per_token = measure_seconds_per_token(model, self.vision)
        except Exception:  # the rate stays unknown; encoding itself reports its own failures
            log.exception("measuring the vision tower's rate failed")

    def _metrics(self) -> EncoderMetrics:
        metrics, cache = EncoderMetrics(self.inbox.metrics), self.cache
        metrics.num_items_encoded.read_from(lambda: self.num_items_encoded)
        metrics.tower_seconds.read_from(lambda: self.tower_seconds)
        metrics.num_cache_evictions.read_from(lambda: cache.num_evictions)
        metrics.cache.read_from(lambda: cache.cache_size - cache.num_free_slots, lambda: cache.cache_size)
        metrics.cache_rows.read_from(lambda: cache.cache_size - cache.num_free_slots)
        metrics.num_embedding_bytes_sent.read_from(lambda: self.sender.num_bytes_sent)
        metrics.tower_seconds_per_token.read_from(lambda: self.seconds_per_token)
        registry = self.adapters.registry
        metrics.lora_adapters.read_from(lambda: len(registry.names()) if registry is not None else 0)
        metrics.lora_bytes.read_from(lambda: registry.loaded_bytes() if registry is not None else 0)
        return metrics

    @property
    def data_address(self) -> AdvertisedAddress:
        """Where peers push this node pixels: what it hands out, never its bound endpoint."""
        return self.inbox.address

    async def encode(self, items: list[EncodeItem], target_address: str) -> EncodeResult:
        """One call's items, encoded and shipped to ``target_address`` (raises its failure)."""
        [result] = await self.encode_batch([(items, target_address)])
        if isinstance(result, Exception):
            raise result
        return result

    async def encode_batch(self, calls: list[tuple[list[EncodeItem], str]]) -> list[EncodeResult | Exception]:
        """Several calls' items in one vision-tower pass; each call's result, or its own failure.
        One batch at a time (the servicer's batcher sees to it)."""
        self.num_pending += len(calls)
        try:
            pixels = await self._pixels_for(calls)
            return await self.compute.call(self._encode_batch, calls, pixels)
        finally:
            self.num_pending -= len(calls)

    async def _pixels_for(self, calls: list[tuple[list[EncodeItem], str]]) -> dict[MmHash, torch.Tensor]:
        """The pixels of the batch's images the cache lacks, awaited together; an image whose
        pixels do not come within ``pixel_wait_s`` is left out (its call reports it missing)."""
        lacking = list(dict.fromkeys(item.mm_hash for items, _ in calls for item in items if item.mm_hash not in self.store))
        waits = (self.inbox.arrival(h, self.pixel_wait_s, sender="a preprocess node", what="pixels of image") for h in lacking)
        messages = await asyncio.gather(*waits)
        return {h: m.tensors["pixel_values"] for h, m in zip(lacking, messages, strict=True) if m is not None}

    def cluster_config(self) -> ClusterConfig:
        """What this node must share with its cluster: the dtype of the embeddings it sends (it
        keeps no KV pages, so no block size)."""
        return ClusterConfig(dtype=dtype_name(COMPUTE_DTYPE))

    def load(self) -> tuple[float, float]:
        """(calls queued or running, 0: no KV pool), for heartbeats."""
        return float(self.num_pending), 0.0

    def _encode_batch(
        self, calls: list[tuple[list[EncodeItem], str]], pixels: dict[MmHash, torch.Tensor]
    ) -> list[EncodeResult | Exception]:
        # Runs only on the compute thread, one batch at a time: no lock needed.
        # 1. Per call, in order: cache hits, pixels to encode, or missing. An image another call
        #    of the batch already brings pixels for is encoded once (its pixels come once: the
        #    preprocess node's mirror skips the second push).
        to_encode: dict[MmHash, tuple[EncodeItem, torch.Tensor]] = {}
        plans = [_plan_call(items, self, to_encode, pixels) for items, _ in calls]
        # 2. One pass over every image to encode; if it fails, each call's images alone, so an
        #    input that breaks the tower fails only the calls that brought it.
        encoded, failed = self._encode_all(to_encode, plans)
        # 3. Ship each call's embeddings to its own target.
        results: list[EncodeResult | Exception] = []
        for (_, target), plan in zip(calls, plans):
            error = next((failed[h] for h in plan.encoding if h in failed), None)
            if error is not None:
                results.append(error)
                continue
            try:
                for mm_hash in plan.hits + plan.encoding:
                    embeds = plan.ready.get(mm_hash)
                    if embeds is None:
                        embeds = encoded[mm_hash]
                    self.sender.send(target, mm_hash, {"embeds": embeds}, {"rows": embeds.shape[0]})
            except Exception as exc:  # a target that does not drain fails its own call only
                results.append(exc)
                continue
            results.append(EncodeResult(plan.missing, len(plan.encoding), len(plan.hits)))
        return results

    def _encode_all(
        self, to_encode: dict[MmHash, tuple[EncodeItem, torch.Tensor]], plans: list[CallPlan]
    ) -> tuple[dict[MmHash, torch.Tensor], dict[MmHash, Exception]]:
        encoded: dict[MmHash, torch.Tensor] = {}
        failed: dict[MmHash, Exception] = {}
        try:
            encoded.update(self._run_tower(list(to_encode), to_encode))
        except Exception:
            for plan in plans:  # one call's new images at a time
                own = [h for h in plan.encoding if h not in encoded and h not in failed]
                try:
                    encoded.update(self._run_tower(own, to_encode))
                except Exception as exc:
                    failed.update(dict.fromkeys(own, exc))
        for mm_hash, embeds in encoded.items():
            self._cache(mm_hash, embeds, to_encode[mm_hash][0].grid_thw)
        return encoded, failed

    def _run_tower(self, mm_hashes: list[MmHash], to_encode: dict[MmHash, tuple[EncodeItem, torch.Tensor]]) -> dict[MmHash, torch.Tensor]:
        """Passes of at most ``max_pass_rows`` embedding rows each (an item larger alone gets a
        pass of its own): a long clip's groups, or a large batch, never in one pass whose
        activations grow with the whole call."""
        encoded: dict[MmHash, torch.Tensor] = {}
        for run in tower_passes(mm_hashes, lambda h: to_encode[h][0], self.max_pass_rows):
            started = time.perf_counter()
            adapter = to_encode[run[0]][0].adapter
            with self.tower_loras.running(adapter) if self.tower_loras is not None else contextlib.nullcontext():
                outputs = self.vision.encode([to_encode[h][1] for h in run], [to_encode[h][0].grid_thw for h in run])
            self.tower_seconds += time.perf_counter() - started
            self.num_items_encoded += len(run)
            self.num_batches += 1
            encoded.update(zip(run, outputs))
        return encoded

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

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.stop()
        self.compute.close()
        self.inbox.close()
        self.sender.close()


def _plan_call(
    items: list[EncodeItem],
    node: EncoderNode,
    to_encode: dict[MmHash, tuple[EncodeItem, torch.Tensor]],
    pixels: dict[MmHash, torch.Tensor],
) -> CallPlan:
    plan = CallPlan([], [], [], {})
    for item in items:
        if item.mm_hash in plan.ready or item.mm_hash in plan.encoding:
            continue
        if item.mm_hash in to_encode:  # another call of the batch brought its pixels
            plan.encoding.append(item.mm_hash)
            continue
        if node.cache.check_and_update_cache(_OWNER, item.mm_hash):
            node.cache.free_encoder_input(_OWNER, item.mm_hash)  # refresh its LRU position
            plan.ready[item.mm_hash] = node.store[item.mm_hash]
            plan.hits.append(item.mm_hash)
            node.metrics.num_cache_hits.inc()
            continue
        if item.mm_hash not in pixels:
            plan.missing.append(item.mm_hash)
        else:
            to_encode[item.mm_hash] = (item, pixels[item.mm_hash])
            plan.encoding.append(item.mm_hash)
    return plan


def _build_vision(model: ModelRef, device: str, prepack: bool) -> VisionEncoder:
    family = model.family
    _, vision_weights = load_weights(model.path, COMPUTE_DTYPE, family.weight_group)
    return family.build_vision(family.read_config(model.path), vision_weights, COMPUTE_DTYPE, torch.device(device), prepack=prepack)
