"""What prefill and decode nodes share: an engine on its own loop thread, a data-plane inbox and
sender, publishing of the KV pool's store/evict events to the cache index after every step, and
exporting cached prefix pages to a peer that pulls them."""

from __future__ import annotations

import functools
import logging

from services.engine import connector, kv_pages
from services.engine.config import EngineConfig
from services.engine.engine import Engine
from services.engine.engine_loop import EngineLoop
from services.models.checkpoint import dtype_name
from services.models.registry import ModelRef
from services.transport.tensor_channel import OPEN_CHANNEL, ChannelAuth, TensorInbox, TensorSender
from shared.cache_gauges import cache_gauges
from shared.index.cluster_config import ClusterConfig
from shared.index.kv_events import kv_index_events
from shared.index.publisher import IndexPublisher
from shared.liveness import Liveness
from shared.types import BlockHash

log = logging.getLogger("tessera.kv")


class EngineNode:
    def __init__(
        self,
        model: ModelRef,
        config: EngineConfig,
        *,
        data_bind: str,
        publisher: IndexPublisher | None = None,
        liveness: Liveness | None = None,
        channel_auth: ChannelAuth = OPEN_CHANNEL,
        load_vision: bool = False,
    ) -> None:
        self.publisher = publisher
        self.loop = EngineLoop(lambda: Engine(model, config, load_vision=load_vision), after_step=self._publish_kv, liveness=liveness)
        self.engine = self.loop.engine  # touch it only through self.loop.call once serving
        family, checkpoint = model.family, self.engine.runner.checkpoint
        self.positions = functools.partial(family.positions, checkpoint)  # remote_request.PositionsFn
        self.pixels_match = functools.partial(family.pixels_match, checkpoint)  # local_pixels.PixelsMatchFn
        self.inbox = TensorInbox(data_bind, auth=channel_auth)
        self.sender = TensorSender(auth=channel_auth)
        self.num_kv_blocks_exported = 0

    @property
    def data_address(self) -> str:
        return self.inbox.address

    def cluster_config(self) -> ClusterConfig:
        """What this node must share with its cluster: the block size its KV blocks and their
        hashes are cut at, and the dtype of the pages it exchanges."""
        return ClusterConfig(block_size=self.engine.config.block_size, dtype=dtype_name(self.engine.runner.dtype))

    def load(self) -> tuple[float, float]:
        """(requests queued or running, fraction of KV pages in use), for heartbeats."""
        pool = self.engine.kv.pool
        return float(len(self.engine.scheduler.running) + len(self.engine.scheduler.waiting)), 1.0 - pool.num_free_blocks / pool.num_blocks

    def engine_gauges(self) -> dict[str, float]:
        """Requests in the running batch and waiting for a step (vLLM's running and waiting).
        Read from the gRPC thread: list lengths, at worst one step stale."""
        scheduler = self.engine.scheduler
        return {"engine_requests_running": float(len(scheduler.running)), "engine_requests_waiting": float(len(scheduler.waiting))}

    def queue_time_counters(self) -> dict[str, float]:
        """The engine's queue-time histogram (arrival to first scheduled step), flattened."""
        return self.engine.scheduler.queue_time.counters()

    def cache_gauges(self) -> dict[str, float]:
        """The KV pool (blocks held by requests; blocks holding cached prefix KV, held or free) and
        the embedding cache, with their evictions. Read from the gRPC thread: plain int reads, at worst one step stale."""
        pool, embeddings = self.engine.kv.pool, self.engine.encoder_cache
        return {
            **cache_gauges("kv", "blocks", pool.num_blocks - pool.num_free_blocks, pool.num_blocks),
            **cache_gauges("prefix", "blocks", len(pool.hash_to_block), pool.num_blocks),
            **cache_gauges("embedding", "rows", embeddings.cache_size - embeddings.num_free_slots, embeddings.cache_size),
            "prefix_cache_evictions_total": float(pool.num_evictions),
            "embedding_cache_evictions_total": float(embeddings.num_evictions),
        }

    def export_kv(self, hashes: list[BlockHash], target: str, transfer_id: str) -> int:
        """Push the pages of the leading blocks of ``hashes`` held here to ``target``'s inbox
        under ``transfer_id``; returns how many blocks were sent (0: nothing is sent). The
        pages are copied on the engine thread, so a later eviction cannot tear them."""
        pages = self.loop.call(lambda engine: connector.export_prefix(engine, hashes)).result()
        num_blocks = kv_pages.num_blocks(pages)
        if num_blocks == 0:
            return 0
        self.send_pages(target, transfer_id, pages)
        self.num_kv_blocks_exported += num_blocks
        return num_blocks

    def send_pages(self, target: str, key: str, pages: kv_pages.KVPages) -> None:
        tensors, meta = kv_pages.pack(pages)
        self.sender.send(target, key, tensors, meta)

    def receive_pages(self, key: str, timeout_s: float) -> kv_pages.KVPages | None:
        """The pages sent under ``key``, or None if they do not arrive in time (or arrive in a
        format this node cannot read, which is logged and treated the same way)."""
        message = self.inbox.wait(key, timeout_s)
        if message is None:
            return None
        try:
            return kv_pages.unpack(message.tensors, message.meta, self.engine.runner.checkpoint.shape.num_layers)
        except kv_pages.PageFormatError as exc:
            log.error("dropped KV pages %s: %s", key, exc)
            return None

    def _publish_kv(self, engine: Engine) -> None:
        events = engine.kv.pool.drain_events()
        if self.publisher is not None and events:
            self.publisher.record(kv_index_events(events))

    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.stop()
        self.loop.stop()
        self.inbox.close()
        self.sender.close()
