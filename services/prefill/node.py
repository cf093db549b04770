"""Prefill node: computes a prompt's KV (reusing its prefix cache), samples the first token, and
pushes the prompt's KV pages to the decode node's data address.

Prefix KV: before running a prompt, the node may pull the pages of a longer cached prefix from a
peer the router named (kv_pull.py decides whether that beats recomputing). Pulled pages are filed
under their block hashes as ordinary cached blocks, so the normal prefix lookup adopts them; a
failed or late pull simply leaves them to be recomputed.

Embeddings: the node keeps its own embedding cache (the engine's encoder cache). Items it lacks
are pulled from the encoder node, which pushes them to this node's inbox. Claims and imports run
on the engine thread, and each holds a reference for the request, so nothing it needs can be
evicted before the request is scheduled. With ``local_encode`` the engine also holds the vision
tower: images the router chose to encode here arrive as pixels, ride on the request, and the
engine encodes them in its step under its encoder budget, exactly as the one-process engine does.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, replace

import torch

from services.engine import connector
from services.engine.config import EngineConfig
from services.engine.engine import Engine
from services.engine.engine_node import EngineNode
from services.engine.output_processor import RequestOutput
from services.engine.remote_request import PromptItem
from services.engine.request import Request
from services.engine.sampling_params import TokenLogprobs
from services.models.registry import ModelRef
from services.prefill.embedding_index import EmbeddingIndex
from services.prefill.kv_pull import KVSource, PullCostModel, blocks_to_pull, kv_bytes_per_token, updated_rate
from services.prefill.local_pixels import LocalEncodeUnavailableError, take_pixels
from services.transport.tensor_channel import OPEN_CHANNEL, ChannelAuth, TensorSendTimeoutError
from shared.cache_gauges import cache_counters
from shared.index.publisher import IndexPublisher
from shared.liveness import Liveness
from shared.types import BlockHash, MmHash

log = logging.getLogger("tessera")


class EmbeddingsUnavailableError(RuntimeError):
    def __init__(self, missing: list[str]) -> None:
        super().__init__(f"embeddings unavailable for {len(missing)} image(s)")
        self.missing = missing


@dataclass(frozen=True, slots=True)
class PrefillResult:
    first_token_id: int
    num_cached_tokens: int
    mrope_delta: int
    first_token_logprobs: TokenLogprobs | None = None


@dataclass(frozen=True, slots=True)
class PullPlan:
    source: KVSource
    hashes: list[BlockHash]  # the blocks to ask the source for, in prompt order
    transfer_id: str


class PrefillNode(EngineNode):
    def __init__(
        self,
        model: ModelRef,
        config: EngineConfig,
        *,
        data_bind: str,
        embedding_wait_s: float = 30.0,
        prefill_timeout_s: float = 600.0,
        publisher: IndexPublisher | None = None,
        liveness: Liveness | None = None,
        kv_pull_bandwidth_bytes_per_s: float = 1.0e9,
        kv_pull_overhead_s: float = 0.005,
        kv_pull_timeout_s: float = 10.0,
        prefill_s_per_token: float = 0.0007,
        channel_auth: ChannelAuth = OPEN_CHANNEL,
        local_encode: bool = False,
    ) -> None:
        self.embedding_index = EmbeddingIndex()  # touched on the engine thread only (set before it starts)
        super().__init__(
            model, config, data_bind=data_bind, publisher=publisher, liveness=liveness, channel_auth=channel_auth, load_vision=local_encode
        )
        text = self.engine.runner.checkpoint.shape
        self.pull_cost = PullCostModel(
            kv_bytes_per_token(text.num_layers, text.num_kv_heads, text.head_dim, self.engine.runner.kv_caches[0][0].element_size()),
            kv_pull_bandwidth_bytes_per_s,
            kv_pull_overhead_s,
        )
        self.kv_pull_timeout_s = kv_pull_timeout_s
        self.prefill_s_per_token = prefill_s_per_token
        self.num_kv_blocks_pulled = 0
        self.num_kv_pull_failures = 0
        self.embedding_wait_s = embedding_wait_s
        self.prefill_timeout_s = prefill_timeout_s
        self._decode_targets: dict[str, str] = {}
        self.engine.finish_listeners.append(self._ship_kv)
        self._pulls_lock = threading.Lock()
        self._mm_hash_to_pull: dict[MmHash, threading.Event] = {}
        self._tower_lock = threading.Lock()  # one local tower pass at a time
        self.num_embeddings_pulled = 0
        self.num_local_encodes = 0  # images whose pixels came here to be encoded by this node
        self.num_embedding_hits = 0  # images of a request found in the embedding cache (claims)
        self.num_embedding_misses = 0
        self.num_kv_blocks_pull_missed = 0  # blocks a pull was planned for but did not bring
        self.num_tokens_computed = 0
        self.num_cached_tokens = 0

    def claim_local_embeddings(self, request_id: str, items: list[PromptItem]) -> list[PromptItem]:
        """Reference the items this node already holds; returns those it lacks."""

        def claim(engine: Engine) -> list[PromptItem]:
            for item in items:  # every image reaching this node passes here, on the engine thread
                self.embedding_index.remember_grid(item.mm_hash, item.grid_thw)
            lacking = [i for i in items if not engine.encoder_cache.check_and_update_cache(request_id, i.mm_hash)]
            self.num_embedding_hits += len(items) - len(lacking)
            self.num_embedding_misses += len(lacking)
            return lacking

        return self.loop.call(claim).result()

    def begin_pulls(self, items: list[PromptItem]) -> tuple[list[PromptItem], list[PromptItem]]:
        """Split ``items`` into those the caller must fetch from an encoder and those another
        request is already fetching. Each image is fetched once at a time: the data-plane inbox
        hands a pushed message to one waiter only."""
        mine, others = [], []
        with self._pulls_lock:
            for item in items:
                if item.mm_hash in self._mm_hash_to_pull:
                    others.append(item)
                else:
                    self._mm_hash_to_pull[item.mm_hash] = threading.Event()
                    mine.append(item)
        return mine, others

    def end_pulls(self, items: list[PromptItem]) -> None:
        """The caller's fetches of ``items`` are over (imported or failed): wake their waiters."""
        with self._pulls_lock:
            events = [self._mm_hash_to_pull.pop(item.mm_hash, None) for item in items]
        for event in events:
            if event is not None:
                event.set()

    def await_pulls(self, request_id: str, items: list[PromptItem]) -> list[PromptItem]:
        """Wait for other requests' fetches of ``items``, then reference them for this request;
        returns those still lacking (a fetch failed, or the image was evicted since)."""
        for item in items:
            with self._pulls_lock:
                event = self._mm_hash_to_pull.get(item.mm_hash)
            if event is not None:
                event.wait(self.embedding_wait_s)
        return self.claim_local_embeddings(request_id, items)

    def receive_embeddings(self, request_id: str, items: list[PromptItem]) -> None:
        """Wait for pushed embeddings of ``items`` and import them; raises if any never arrive."""
        missing = []
        for item in items:
            message = self.inbox.wait(item.mm_hash, self.embedding_wait_s)
            if message is None:
                missing.append(item.mm_hash)
                continue
            self._import_embeddings(request_id, item, message.tensors["embeds"])
            self.num_embeddings_pulled += 1
        if missing:
            raise EmbeddingsUnavailableError(missing)

    def encode_here(self, request_id: str, items: list[PromptItem], pixels: dict[MmHash, torch.Tensor]) -> None:
        """Encode ``items`` (the images the router chose this node to encode; ``pixels`` by
        mm_hash) with this node's own tower on the calling thread, and import the embeddings as
        if an encoder had sent them. Off the engine thread: run inside an engine step, a tower
        pass (0.7 s a 448x448 image on one core) held back every prompt whose embeddings were
        ready, which traces of a burst of cold images showed waiting behind it. One pass at a
        time; an image another request is already encoding or fetching here is awaited, and
        encoded here after all if that fails."""
        mine, others = self.begin_pulls(items)
        try:
            self._encode_and_import(request_id, mine, pixels)
        finally:
            self.end_pulls(mine)
        if others:
            self._encode_and_import(request_id, self.await_pulls(request_id, others), pixels)

    def _encode_and_import(self, request_id: str, items: list[PromptItem], pixels: dict[MmHash, torch.Tensor]) -> None:
        vision = self.engine.runner.vision
        if not items:
            return
        if vision is None:
            raise LocalEncodeUnavailableError("this prefill node has no vision tower (started with --local-encode false)")
        with self._tower_lock:
            embeds = vision.encode([pixels[i.mm_hash] for i in items], [i.grid_thw for i in items])
        for item, rows in zip(items, embeds):
            self._import_embeddings(request_id, item, rows)

    def _import_embeddings(self, request_id: str, item: PromptItem, embeds: torch.Tensor) -> None:
        if embeds.shape[0] != item.placeholder.length:
            raise ValueError(f"embeddings for {item.mm_hash} have {embeds.shape[0]} rows, expected {item.placeholder.length}")
        if not self.loop.call(lambda engine: connector.import_embeddings(engine, request_id, item.mm_hash, embeds)).result():
            raise RuntimeError("prefill node's embedding cache is full; retry later")

    @property
    def can_encode(self) -> bool:
        return self.engine.runner.vision is not None

    def receive_pixels(self, key_prefix: str, items: list[PromptItem], lacking: list[PromptItem]) -> dict[MmHash, torch.Tensor]:
        """Pixels pushed here for ``items`` (the images the router chose this node to encode), for
        those among ``lacking``: see local_pixels.take_pixels."""
        if items and not self.can_encode:
            raise LocalEncodeUnavailableError("this prefill node has no vision tower (started with --local-encode false)")
        pixels = take_pixels(self.inbox, key_prefix, items, lacking, wait_s=self.embedding_wait_s, pixels_match=self.pixels_match)
        self.num_local_encodes += len(pixels)
        return pixels

    def release(self, request_id: str, items: list[PromptItem]) -> None:
        self.loop.call(lambda engine: engine.encoder_cache.free_request(request_id, [i.mm_hash for i in items]))

    def plan_pull(self, request: Request, sources: list[KVSource]) -> PullPlan | None:
        """The pull worth making for ``request``, if any: from the source holding the longest
        prefix beyond ours, when the cost model says pulling beats recomputing."""
        block_size = self.engine.config.block_size
        hashes = request.update_block_hashes(block_size)
        if not sources:
            return None
        source = max(sources, key=lambda s: s.num_tokens)  # a shorter prefix could only save less
        num_local = self.loop.call(lambda engine: connector.num_cached_blocks(engine, hashes)).result()
        wanted = blocks_to_pull(num_local, source, request.num_prompt_tokens, block_size)
        if not self.pull_cost.should_pull(len(wanted) * block_size, self.prefill_s_per_token, block_size):
            return None
        return PullPlan(source, hashes[wanted.start : wanted.stop], f"kv-{uuid.uuid4().hex}")

    def record_pull_failure(self, plan: PullPlan, num_blocks_missed: int | None = None) -> None:
        self.num_kv_pull_failures += 1
        self.num_kv_blocks_pull_missed += len(plan.hashes) if num_blocks_missed is None else num_blocks_missed

    def receive_kv(self, plan: PullPlan, num_blocks: int) -> int:
        """Wait for the pages the source announced and file them as cached blocks; returns the
        number imported (0 on timeout: the prompt is then recomputed)."""
        if num_blocks == 0:
            self.num_kv_blocks_pull_missed += len(plan.hashes)
            return 0  # the source no longer held them: nothing was sent
        pages = self.receive_pages(plan.transfer_id, self.kv_pull_timeout_s)
        if pages is None:
            self.record_pull_failure(plan)
            return 0
        hashes = plan.hashes[:num_blocks]
        imported = self.loop.call(lambda engine: connector.import_blocks(engine, hashes, pages)).result()
        self.num_kv_blocks_pulled += imported
        self.num_kv_blocks_pull_missed += len(plan.hashes) - imported
        return imported

    def start_prefill(self, request: Request, decode_address: str) -> Future:
        """Queue the prompt (its embeddings already claimed). The future resolves with the
        engine's output once the first token is sampled, its KV pages then on their way to
        ``decode_address``; or fails with the request's own error. ``abort`` stops it."""
        # Only the first token is sampled here (with the request's own sampling settings); stop
        # conditions are the decode node's job. EOS and the stop token ids stay, for min_tokens
        # to keep them from being drawn: after one token the request ends here either way.
        request.sampling = replace(request.sampling, max_tokens=1, min_tokens=min(request.sampling.min_tokens, 1), stop=())
        done: Future = Future()
        self._decode_targets[request.request_id] = decode_address
        self.loop.subscribe(request.request_id, lambda outcome: _settle(done, outcome))
        added = self.loop.call(lambda engine: engine.add(request))
        added.add_done_callback(lambda call: call.exception() is not None and _settle(done, call.exception()))
        return done

    def finish_prefill(self, request: Request, output: RequestOutput, elapsed_s: float) -> PrefillResult:
        """Account a prefill that finished in ``elapsed_s``, and shape its result."""
        self.num_cached_tokens += output.num_cached_tokens
        num_computed = request.num_prompt_tokens - output.num_cached_tokens
        self.num_tokens_computed += num_computed
        self.prefill_s_per_token = updated_rate(self.prefill_s_per_token, elapsed_s, num_computed)
        logprobs = output.new_logprobs[0] if output.new_logprobs else None
        return PrefillResult(output.new_token_ids[0], output.num_cached_tokens, request.mrope_delta, logprobs)

    def prefill(self, request: Request, decode_address: str) -> PrefillResult:
        """Run the prompt (embeddings already claimed) and ship its KV; blocks until done."""
        started = time.perf_counter()
        done = self.start_prefill(request, decode_address)
        try:
            output = done.result(timeout=self.prefill_timeout_s)
        except BaseException:
            self.abort(request.request_id)
            raise
        return self.finish_prefill(request, output, time.perf_counter() - started)

    def abort(self, request_id: str) -> None:
        """Stop a request nobody waits for any more (its call was cancelled or ran out of time,
        or it failed): it leaves the engine, and its KV pages are never shipped. Calls reach the
        engine thread in order, so an abort after ``start_prefill`` always finds the request."""
        self._decode_targets.pop(request_id, None)
        self.loop.unsubscribe(request_id)
        self.loop.call(lambda engine: engine.abort(request_id))

    def _publish_kv(self, engine: Engine) -> None:
        """Engine-thread hook after every step: KV blocks, then the embeddings held here."""
        super()._publish_kv(engine)
        if self.publisher is not None:
            events = self.embedding_index.changes(engine.runner.encoder_outputs)
            if events is not None:
                self.publisher.record(events)

    def _ship_kv(self, request: Request) -> None:
        """Engine-thread hook: push the prompt's KV pages before the blocks are released."""
        target = self._decode_targets.pop(request.request_id, None)
        if target is None:
            return
        num_blocks = -(-request.num_prompt_tokens // self.engine.config.block_size)
        try:
            self.send_pages(target, request.request_id, connector.read_request_pages(self.engine, request, num_blocks))
        except TensorSendTimeoutError as exc:
            # Never raise on the engine thread (it would fail every request in the step): the
            # decode node times out waiting for these pages and the gateway retries elsewhere.
            log.warning("KV pages of %s not delivered: %s", request.request_id, exc)

    def counters(self) -> dict[str, float]:
        return {
            "prefill_embeddings_pulled_total": float(self.num_embeddings_pulled),
            "prefill_images_encoded_locally_total": float(self.num_local_encodes),
            "prefill_kv_bytes_sent_total": float(self.sender.num_bytes_sent),
            "prefill_tokens_computed_total": float(self.num_tokens_computed),
            "prefix_cached_tokens_total": float(self.num_cached_tokens),
            "prefill_kv_blocks_pulled_total": float(self.num_kv_blocks_pulled),
            "prefill_kv_pull_failures_total": float(self.num_kv_pull_failures),
            "engine_requests_aborted_total": float(self.engine.num_aborted),
            # Hit rates: prefix in prompt tokens, embeddings in images, remote KV in blocks pulled
            # from a peer against blocks a planned pull did not bring (not a store: no evictions).
            # Evictions of the prefix and embedding caches come with cache_gauges.
            **cache_counters("prefix", hits=self.num_cached_tokens, misses=self.num_tokens_computed),
            **cache_counters("embedding", hits=self.num_embedding_hits, misses=self.num_embedding_misses),
            **cache_counters("remote_kv", hits=self.num_kv_blocks_pulled, misses=self.num_kv_blocks_pull_missed),
            "kv_blocks_exported_total": float(self.num_kv_blocks_exported),
            **self.inbox.counters(),
            **self.cache_gauges(),
            **self.engine_gauges(),
            **self.queue_time_counters(),
        }


def _settle(done: Future, outcome: RequestOutput | BaseException) -> None:
    try:
        if isinstance(outcome, BaseException):
            done.set_exception(outcome)
        else:
            done.set_result(outcome)
    except InvalidStateError:
        pass  # its waiter already cancelled it (the call went away)
