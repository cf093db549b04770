"""What prefill and decode nodes share: an engine on its own loop thread, a data-plane inbox and
sender, publishing of the KV pool's store/evict events to the cache index after every step,
exporting cached prefix pages to a peer that pulls them, and the metrics of all these
(``EngineMetrics``, which each role's own record nests)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from services.engine import connector, kv_pages
from services.engine.config import EngineConfig
from services.engine.engine import Engine
from services.engine.engine_loop import EngineLoop
from services.engine.lora.node_adapters import NodeAdapters
from services.engine.lora.registry import LoraRegistry
from services.models.checkpoint import dtype_name
from services.models.lora.adapter import LoraAdapter
from services.models.lora.modules import parse_lora_modules
from services.models.registry import ModelRef
from services.transport.addresses import AdvertisedAddress
from services.transport.tensor_channel import OPEN_CHANNEL, ChannelAuth, InboxMetrics, TensorInbox, TensorSender
from shared.cache_gauges import CacheGauges, cache_gauges
from shared.index.cluster_config import ClusterConfig
from shared.index.kv_events import kv_index_events
from shared.index.publisher import IndexPublisher
from shared.liveness import Liveness
from shared.node_metrics import Counter, Gauge, Histogram, counter, gauge
from shared.types import BlockHash

log = logging.getLogger("tessera.kv")


@dataclass(slots=True)
class EngineMetrics:
    """The engine's requests, its caches and their evictions, and the node's data plane. Read from
    the gRPC thread: list lengths and int reads, at worst one engine step stale."""

    inbox: InboxMetrics
    queue_time: Histogram  # the scheduler's
    num_kv_blocks_exported: Counter = counter("kv_blocks_exported_total", "KV blocks pushed to peers that pulled a cached prefix")
    num_requests_aborted: Counter = counter(
        "engine_requests_aborted_total", "Requests stopped unfinished: their caller left or ran out of time, or their step failed"
    )
    # vLLM's running and waiting.
    requests_running: Gauge = gauge("engine_requests_running", "Requests in the engine's running batch")
    requests_waiting: Gauge = gauge("engine_requests_waiting", "Requests waiting for an engine step")
    # Blocks held by requests; blocks holding cached prefix KV (held or free); embedding rows.
    kv_cache: CacheGauges = cache_gauges("kv", "blocks")
    prefix_cache: CacheGauges = cache_gauges("prefix", "blocks")
    embedding_cache: CacheGauges = cache_gauges("embedding", "rows")
    num_prefix_evictions: Counter = counter("prefix_cache_evictions_total", "Cached prefix blocks evicted")
    num_embedding_evictions: Counter = counter("embedding_cache_evictions_total", "Images' embeddings evicted from the engine's cache")
    lora_adapters: Gauge = gauge("lora_adapters_served", "LoRA adapters this node serves (--lora-modules and runtime loads)")
    lora_bytes: Gauge = gauge(
        "lora_adapter_bytes", "Bytes of the LoRA adapters' weights this node holds in memory (at most --max-cpu-loras of them)"
    )


class EngineNode:
    def __init__(
        self,
        model: ModelRef,
        config: EngineConfig,
        *,
        data_bind: str,
        advertise_host: str | None = None,
        publisher: IndexPublisher | None = None,
        liveness: Liveness | None = None,
        channel_auth: ChannelAuth = OPEN_CHANNEL,
        load_vision: bool = False,
        min_step_interval: Callable[[int], float] | None = None,
    ) -> None:
        self.publisher = publisher
        self.loop = EngineLoop(
            lambda: Engine(model, config, load_vision=load_vision),
            after_step=self._publish_kv,
            liveness=liveness,
            min_step_interval=min_step_interval,
        )
        self.engine = self.loop.engine  # touch it only through self.loop.call once serving
        # The LoRA adapters this node serves (--enable-lora, --lora-modules), by name.
        self.loras: LoraRegistry | None = None
        if config.enable_lora:
            modules = parse_lora_modules(config.lora_modules)
            max_loaded = config.max_cpu_loras or config.max_loras
            banks = [bank for bank in (self.engine.runner.text_loras, self.engine.runner.tower_loras) if bank is not None]

            def check(adapter: LoraAdapter) -> None:  # it fits the decoder's layers, and the tower's where this node has one
                for bank in banks:
                    bank.check(adapter)

            self.loras = LoraRegistry(
                model.family.weight_group, max_rank=config.max_lora_rank, max_loaded=max_loaded, modules=modules, check=check
            )
        self.adapters = NodeAdapters(self.loras, on_change=self._adapters_changed)
        family, checkpoint = model.family, self.engine.runner.checkpoint
        self.positions = functools.partial(family.positions, checkpoint)  # remote_request.PositionsFn
        self.pixels_match = functools.partial(family.pixels_match, checkpoint)  # local_pixels.PixelsMatchFn
        self.inbox = TensorInbox(data_bind, advertise_host=advertise_host, auth=channel_auth)
        self.sender = TensorSender(auth=channel_auth)
        self.engine_metrics = self._engine_metrics()

    def _adapters_changed(self) -> None:
        if self.publisher is not None:
            self.publisher.record_changed()

    @property
    def data_address(self) -> AdvertisedAddress:
        """Where peers push this node tensors: what it hands out, never its bound endpoint."""
        return self.inbox.address

    def cluster_config(self) -> ClusterConfig:
        """What this node must share with its cluster: the block size its KV blocks and their
        hashes are cut at, and the dtype of the pages it exchanges."""
        return ClusterConfig(block_size=self.engine.config.block_size, dtype=dtype_name(self.engine.runner.dtype))

    def load(self) -> tuple[float, float]:
        """(requests queued or running, fraction of KV pages in use), for heartbeats."""
        pool = self.engine.kv.pool
        return float(len(self.engine.scheduler.running) + self.engine.scheduler.num_waiting()), 1.0 - pool.num_free_blocks / pool.num_blocks

    def _engine_metrics(self) -> EngineMetrics:
        engine = self.engine
        scheduler, pool, embeddings = engine.scheduler, engine.kv.pool, engine.encoder_cache
        metrics = EngineMetrics(self.inbox.metrics, scheduler.queue_time)
        metrics.num_requests_aborted.read_from(lambda: engine.num_aborted)
        metrics.requests_running.read_from(lambda: len(scheduler.running))
        metrics.requests_waiting.read_from(scheduler.num_waiting)
        metrics.kv_cache.read_from(lambda: pool.num_blocks - pool.num_free_blocks, lambda: pool.num_blocks)
        metrics.prefix_cache.read_from(lambda: len(pool.hash_to_block), lambda: pool.num_blocks)
        metrics.embedding_cache.read_from(lambda: embeddings.cache_size - embeddings.num_free_slots, lambda: embeddings.cache_size)
        metrics.num_prefix_evictions.read_from(lambda: pool.num_evictions)
        metrics.num_embedding_evictions.read_from(lambda: embeddings.num_evictions)
        loras = self.loras
        metrics.lora_adapters.read_from(lambda: len(loras.names()) if loras is not None else 0)
        metrics.lora_bytes.read_from(lambda: loras.loaded_bytes() if loras is not None else 0)
        return metrics

    async def export_kv(self, hashes: list[BlockHash], target: str, transfer_id: str) -> int:
        """Push the pages of the leading blocks of ``hashes`` held here to ``target``'s inbox
        under ``transfer_id``; returns how many blocks were sent (0: nothing is sent). The
        pages are copied on the engine thread, so a later eviction cannot tear them."""
        pages = await asyncio.wrap_future(self.loop.call(lambda engine: connector.export_prefix(engine, hashes)))
        num_blocks = pages.num_blocks
        if num_blocks == 0:
            return 0
        # A send waits for room in the peer's queue: a thread's wait, not the loop's.
        await asyncio.to_thread(self.send_pages, target, transfer_id, pages)
        self.engine_metrics.num_kv_blocks_exported.inc(num_blocks)
        return num_blocks

    def send_pages(self, target: str, key: str, pages: kv_pages.KVPages) -> None:
        tensors, meta = kv_pages.pack(pages)
        self.sender.send(target, key, tensors, meta)

    async def arrival_of_pages(self, key: str, timeout_s: float, sender: str) -> kv_pages.KVPages | None:
        """The pages ``sender`` sent under ``key``, awaited on the serving loop holding no thread;
        None if they do not arrive in time (or arrive in a format this node cannot read, which is
        logged and treated the same way)."""
        message = await self.inbox.arrival(key, timeout_s, sender=sender, what="KV pages")
        if message is None:
            return None
        try:
            shape = self.engine.runner.checkpoint.shape
            num_state_layers = len(shape.state.layers) if shape.state is not None else 0
            return kv_pages.unpack(message.tensors, message.meta, len(shape.kv_layers), num_state_layers)
        except kv_pages.PageFormatError as exc:
            log.error("dropped KV pages %s: %s", key, exc)
            return None

    def _publish_kv(self, engine: Engine) -> None:
        events = engine.kv.drain_events()
        if self.publisher is not None and events:
            self.publisher.record(kv_index_events(events))

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.stop()
        self.loop.stop()
        self.inbox.close()
        self.sender.close()
