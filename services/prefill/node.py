"""Prefill node: runs one request's prefill in order (``run``): makes its image embeddings
resident (a window at a time, embedding_feed.py), pulls prefix KV from a peer when that beats
recomputing, computes the rest of the prompt's KV, samples the first token, and pushes the
prompt's KV pages to the decode node. An embedding request (``PrefillJob.embed``) pools instead of
sampling, answers its vector and keeps its KV here as a cached prefix.

The servicer only converts at its edges (server.py); each step lives with its own state
(embeddings.py, kv_puller.py). The embeddings a request references from the moment they are
claimed are released in one place if any step fails, so a failed request never pins them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, replace

from services.engine import connector
from services.engine.config import EngineConfig
from services.engine.engine import Engine, RequestRejectedError
from services.engine.engine_node import EngineMetrics, EngineNode
from services.engine.output_processor import RequestOutput
from services.engine.request import Request
from services.models.registry import ModelRef
from services.prefill.embedding_feed import EmbeddingFeed, RequestEndedError, StepSignal
from services.prefill.embedding_index import EmbeddingIndex
from services.prefill.embeddings import EmbeddingMetrics, ResidentEmbeddings
from services.prefill.job import PrefillJob, PrefillResult, Upstream
from services.prefill.kv_pull import PullCostModel, kv_bytes_per_token
from services.prefill.kv_puller import KVPuller, PullMetrics
from services.transport.tensor_channel import OPEN_CHANNEL, ChannelAuth, TensorSendTimeoutError
from shared.index.publisher import IndexPublisher
from shared.liveness import Liveness
from shared.node_metrics import Counter, counter
from shared.types import MmHash

log = logging.getLogger("tessera")


@dataclass(slots=True)
class PrefillMetrics:
    engine: EngineMetrics
    embeddings: EmbeddingMetrics
    pulls: PullMetrics
    num_tokens_computed: Counter = counter("prefill_tokens_computed_total", "Prompt tokens whose KV was computed here")
    num_cached_tokens: Counter = counter("prefix_cached_tokens_total", "Prompt tokens whose KV was cached here or pulled from a peer")
    # The prefix cache's hit rate, in prompt tokens as vLLM counts its prefix-cache queries and hits.
    prefix_hits: Counter = counter("prefix_cache_hits_total", "Prompt tokens whose KV was cached (prefix_cached_tokens_total)")
    prefix_misses: Counter = counter("prefix_cache_misses_total", "Prompt tokens computed (prefill_tokens_computed_total)")
    num_kv_bytes_sent: Counter = counter("prefill_kv_bytes_sent_total", "Bytes of KV pages sent to decode nodes and pulling peers")

    def __post_init__(self) -> None:
        self.prefix_hits.read_from(lambda: self.num_cached_tokens.value)
        self.prefix_misses.read_from(lambda: self.num_tokens_computed.value)


class PrefillNode(EngineNode):
    def __init__(
        self,
        model: ModelRef,
        config: EngineConfig,
        *,
        data_bind: str,
        advertise_host: str | None = None,
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
        post_ready: Callable[[int], None] | None = None,
    ) -> None:
        # Prompts whose embeddings are resident and whose first token is not yet sampled: work
        # this node can compute now. Where decode shares its cores, they go on the host's board
        # (shared/colocation/host_backlog.py) for a colocated decode node to yield to. Event-loop thread only.
        self._post_ready = post_ready
        self.num_ready = 0
        # Before the engine thread starts: its after-step hook publishes from the index.
        self.embedding_index = EmbeddingIndex()
        self.steps = StepSignal()
        self._num_steps_notified = 0  # engine thread only
        super().__init__(
            model,
            config,
            data_bind=data_bind,
            advertise_host=advertise_host,
            publisher=publisher,
            liveness=liveness,
            channel_auth=channel_auth,
            load_vision=local_encode,
        )
        runner = self.engine.runner
        self.embeddings = ResidentEmbeddings(
            self.loop, self.inbox, self.embedding_index, runner.vision, self.pixels_match, wait_s=embedding_wait_s
        )
        self.embeddings.tower_loras = runner.tower_loras  # a local encode runs the request's adapter on the tower
        text = runner.checkpoint.shape
        bytes_per_token = kv_bytes_per_token(len(text.kv_layers), text.num_kv_heads, text.head_dim, runner.kv_caches[0][0].element_size())
        self.kv_puller = KVPuller(
            self.loop,
            self.arrival_of_pages,
            PullCostModel(bytes_per_token, kv_pull_bandwidth_bytes_per_s, kv_pull_overhead_s),
            block_size=self.engine.config.block_size,
            timeout_s=kv_pull_timeout_s,
            prefill_s_per_token=prefill_s_per_token,
        )
        self.prefill_timeout_s = prefill_timeout_s
        self._decode_targets: dict[str, str] = {}
        self.engine.finish_listeners.append(self._ship_kv)
        self.metrics = PrefillMetrics(self.engine_metrics, self.embeddings.metrics, self.kv_puller.metrics)
        self.metrics.num_kv_bytes_sent.read_from(lambda: self.sender.num_bytes_sent)

    async def ship_embeddings(self, mm_hashes: list[MmHash], target: str) -> list[MmHash]:
        """Push the embeddings held here of ``mm_hashes`` to ``target``; returns those not held."""
        return await self.embeddings.ship(mm_hashes, target, self.sender)

    @property
    def can_encode(self) -> bool:
        return self.engine.runner.vision is not None

    async def run(self, job: PrefillJob, upstream: Upstream) -> PrefillResult:
        """Prefill ``job`` and ship its KV pages; returns once its first token is sampled. Raises
        the failing step's error; cancelled (the caller went away), it stops the engine request.

        Its embeddings come window by window (embedding_feed.py): the first before the request
        starts (all of them, when they fit the cache), the rest while it runs."""
        try:
            self._check_fits(job)
            pooling = self.engine.pooling_task(job.embed.dimensions) if job.embed is not None else None
        except RequestRejectedError:
            self.embeddings.drop_pixels(job)  # pushed for a local encode that will never run
            raise
        launch = _Launch(self, job, upstream, job.engine_request(self.positions, await self.adapters.resolve(job.lora), pooling))
        feed = EmbeddingFeed(self.embeddings, job, launch.request, upstream, self.steps, launch.start, launch.ended)
        try:
            async with asyncio.timeout(self.prefill_timeout_s):
                try:
                    await feed.first_window()
                    await launch.start()
                    assert launch.done is not None
                    await feed.alongside(launch.done)
                except RequestEndedError:
                    pass  # its outcome is the engine's
                assert launch.done is not None
                output = await launch.done
        except BaseException:
            if launch.done is not None:  # nobody waits for it any more: the engine stops computing it and ships no KV
                self.abort(job.request_id)
            raise
        finally:
            if launch.done is not None:
                self._count_ready(-1)
            # The engine released what the request referenced when it answered or was aborted;
            # this releases what it never reached, and drops pixels pushed for items found here.
            self.embeddings.release(job.request_id, job.items)
            self.embeddings.drop_pixels(job)
        return self._result(launch, output)

    def _check_fits(self, job: PrefillJob) -> None:
        """A request's items are resident a window at a time, so any number fit; but one item
        whose rows exceed the embedding cache never can, and is refused with the reason."""
        capacity = self.engine.encoder_cache.cache_size
        num_rows = max((item.placeholder.length for item in job.items), default=0)
        if num_rows > capacity:
            raise RequestRejectedError(
                f"an image or video group needs {num_rows} embedding rows; a prefill node holds "
                f"{capacity} (encoder_cache_tokens): send smaller images or frames, or raise it"
            )

    def _result(self, launch: _Launch, output: RequestOutput) -> PrefillResult:
        request = launch.request
        num_computed = request.num_prompt_tokens - output.num_cached_tokens
        self.metrics.num_cached_tokens.inc(output.num_cached_tokens)
        self.metrics.num_tokens_computed.inc(num_computed)
        self.kv_puller.observe_prefill(time.perf_counter() - launch.started_at, num_computed)
        logprobs = output.new_logprobs[0] if output.new_logprobs else None
        if output.embedding is not None:
            return PrefillResult(
                0, output.num_cached_tokens, request.mrope_delta, num_pulled_tokens=launch.num_pulled, embedding=output.embedding
            )
        first_token, prompt_logprobs = output.new_token_ids[0], output.prompt_logprobs or ()
        return PrefillResult(first_token, output.num_cached_tokens, request.mrope_delta, logprobs, launch.num_pulled, prompt_logprobs)

    def _count_ready(self, change: int) -> None:
        self.num_ready += change
        if self._post_ready is not None:
            self._post_ready(self.num_ready)

    def _start(self, request: Request, decode_address: str) -> Future:
        """Queue the prompt. The future resolves with the engine's output once the first token is
        sampled, its KV pages then on their way to ``decode_address``; or fails with the
        request's own error."""
        # Only the first token is sampled here (with the request's own sampling settings); stop
        # conditions are the decode node's job. EOS and the stop token ids stay, for min_tokens
        # to keep them from being drawn: after one token the request ends here either way.
        request.sampling = replace(request.sampling, max_tokens=1, min_tokens=min(request.sampling.min_tokens, 1), stop=())
        done: Future = Future()
        if decode_address:  # an embedding request has none: its KV stays here, as a cached prefix
            self._decode_targets[request.request_id] = decode_address
        self.loop.subscribe(request.request_id, lambda outcome: _settle(done, outcome))
        added = self.loop.call(lambda engine: engine.add(request))
        added.add_done_callback(lambda call: call.exception() is not None and _settle(done, call.exception()))
        return done

    def abort(self, request_id: str) -> None:
        """Stop a request nobody waits for any more: it leaves the engine, and its KV pages are
        never shipped. Calls reach the engine thread in order, so an abort after ``_start``
        always finds the request."""
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
        if engine.num_steps != self._num_steps_notified:  # a step ran: rows may be free, an item awaited
            self._num_steps_notified = engine.num_steps
            self.steps.notify()

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


@dataclass(slots=True)
class _Launch:
    """Starting one request in the engine, once, whoever asks first (the feed starts it early
    when an import finds the cache full): its prefix KV pulled from a peer, then queued."""

    node: PrefillNode
    job: PrefillJob
    upstream: Upstream
    request: Request
    done: asyncio.Future | None = None  # the engine's output once the first token is sampled
    num_pulled: int = 0
    started_at: float = 0.0
    _task: asyncio.Task | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._start())
        await self._task

    async def _start(self) -> None:
        node = self.node
        self.num_pulled = await node.kv_puller.pull(self.request, self.job.kv_sources, self.upstream, node.data_address)
        self.started_at = time.perf_counter()
        self.done = asyncio.wrap_future(node._start(self.request, self.job.decode_address))
        node._count_ready(+1)

    def ended(self) -> bool:
        return self.done is not None and self.done.done()


def _settle(done: Future, outcome: RequestOutput | BaseException) -> None:
    try:
        if isinstance(outcome, BaseException):
            done.set_exception(outcome)
        else:
            done.set_result(outcome)
    except InvalidStateError:
        pass  # its waiter already cancelled it (the call went away)
