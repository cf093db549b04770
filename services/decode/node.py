"""Decode node: adopts requests whose prompt KV arrives from a prefill node, and decodes them
with continuous batching. A cancelled stream aborts its request, which frees its KV pages; one
cancelled while its pages are still on the way is never adopted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass

from opentelemetry import trace

from services.decode.coalesce import OutputCoalescer
from services.decode.job import DecodeFailedError, DecodeJob
from services.engine import connector
from services.engine.config import EngineConfig
from services.engine.connector import KVPagesExhaustedError
from services.engine.engine import Engine, RequestRejectedError
from services.engine.engine_node import EngineMetrics, EngineNode
from services.engine.kv_pages import KVPages
from services.engine.output_processor import RequestOutput
from services.engine.request import Request
from services.engine.sampling_params import TokenLogprobs
from services.models.registry import ModelRef
from services.transport.tensor_channel import OPEN_CHANNEL, ChannelAuth
from shared.colocation.step_pacing import StepPacing
from shared.index.publisher import IndexPublisher
from shared.liveness import Liveness
from shared.loop_handoff import LoopHandoff
from shared.node_metrics import Counter, Gauge, counter, gauge


class KVTransferTimeoutError(RuntimeError):
    pass


@dataclass(slots=True)
class DecodeMetrics:
    engine: EngineMetrics
    # Counted on the engine thread.
    num_requests: Counter = counter("decode_requests_total", "Requests served: adopted, or finished at their first token")
    num_tokens_generated: Counter = counter("decode_tokens_generated_total", "Tokens generated, each request's first included")
    kv_blocks_free: Gauge = gauge("decode_kv_blocks_free", "KV blocks free in the decode engine's pool")
    num_yielding_steps: Counter = counter(
        "decode_yielding_steps_total", "Steps paced to the yield interval: colocated nodes held a first-token backlog"
    )


class DecodeNode(EngineNode):
    def __init__(
        self,
        model: ModelRef,
        config: EngineConfig,
        *,
        data_bind: str,
        advertise_host: str | None = None,
        kv_wait_s: float = 60.0,
        publisher: IndexPublisher | None = None,
        liveness: Liveness | None = None,
        channel_auth: ChannelAuth = OPEN_CHANNEL,
        pacing: StepPacing | None = None,
    ) -> None:
        super().__init__(
            model,
            config,
            data_bind=data_bind,
            advertise_host=advertise_host,
            publisher=publisher,
            liveness=liveness,
            channel_auth=channel_auth,
            min_step_interval=pacing.min_interval_s if pacing is not None else None,
        )
        self.kv_wait_s = kv_wait_s
        self._handoff: LoopHandoff | None = None
        self.metrics = DecodeMetrics(self.engine_metrics)
        pool = self.engine.kv.pool
        self.metrics.kv_blocks_free.read_from(lambda: pool.num_free_blocks)
        if pacing is not None:
            self.metrics.num_yielding_steps.read_from(lambda: pacing.num_yielding_steps)

    async def stream(self, job: DecodeJob) -> AsyncIterator[RequestOutput]:
        """The request's outputs, its first token first: wait for its KV pages, send the first
        token at once, adopt it on the engine thread, then each step's output (or only the last).
        Raises KVTransferTimeoutError, RequestRejectedError (it can never run here),
        KVPagesExhaustedError (no room: busy) or DecodeFailedError. Closed or cancelled before
        its last output, the request is aborted, which frees its KV pages."""
        request, span, finished = job.engine_request(self.positions, await self.adapters.resolve(job.lora)), trace.get_current_span(), False
        try:
            pages = await self.arrival_of_pages(job.request_id, self.kv_wait_s, "its prefill node")
            if pages is None:
                raise KVTransferTimeoutError(f"KV pages for {job.request_id} did not arrive within {self.kv_wait_s}s")
            span.add_event("kv_pages_received")
            first = self.first_output(request, job.first_token_id, job.first_token_logprobs)
            if not first.finished and not self.can_adopt(request):
                raise KVPagesExhaustedError("decode node has no free KV pages for this request; retry later")
            finished = first.finished
            yield first  # before adoption waits for the engine's step in progress
            if finished:
                return
            handoff, queue = self._to_loop(), asyncio.Queue()
            to_client = OutputCoalescer(lambda out: handoff.call(queue.put_nowait, out), every_output=job.every_output)
            await asyncio.wrap_future(self.adopt(request, pages, to_client))
            span.add_event("adopted")
            while not finished:
                output = await queue.get()
                if isinstance(output, BaseException):
                    raise DecodeFailedError(f"decode failed: {output}")
                finished = output.finished
                yield output
        finally:
            if not finished:
                self.abort(job.request_id)

    def _to_loop(self) -> LoopHandoff:
        """One hand-off from the engine thread to the serving loop for every stream: a step's
        outputs wake the loop once (shared/loop_handoff.py). Made on the serving loop, at its first
        stream (again for a new loop: a node outlives the loops of in-process tests)."""
        loop = asyncio.get_running_loop()
        if self._handoff is None or self._handoff.loop is not loop:
            self._handoff = LoopHandoff(loop)
        return self._handoff

    def first_output(self, request: Request, first_token: int, first_token_logprobs: TokenLogprobs | None = None) -> RequestOutput:
        """The request's first output: its first token (sampled by the prefill node), detokenized
        and checked against its stop conditions. Made on the caller's thread before adoption, so
        the client gets its first token without waiting for the engine's step in progress (up to
        one decode step); the request is not the
        engine's yet, and the engine's configuration and tokenizer are only read. Raises
        RequestRejectedError for a request that can never run here."""
        engine = self.engine
        engine.check_admissible(request)
        vocab_size = engine.runner.checkpoint.shape.vocab_size
        if not 0 <= first_token < vocab_size:
            raise RequestRejectedError(f"first token id {first_token} is outside the vocabulary of {vocab_size}")
        status = engine.outputs.append_token(request, first_token)
        if status is not None:  # done at its first token: never adopted, counted here
            request.status = status
            self.loop.call(self._count_first_token)
        return engine.outputs.snapshot(request, [first_token], [first_token_logprobs] if first_token_logprobs is not None else [])

    def can_adopt(self, request: Request) -> bool:
        """Whether the KV pool has room for the request now, read off the engine thread (an int
        read; the engine thread's ``adopt`` decides). Checked before the first token goes out, so
        a node out of pages refuses the stream as busy before the client saw anything of it."""
        kv = self.engine.kv
        return kv.pool.can_allocate(kv.pages_to_adopt(request.num_tokens - 1, request.num_prompt_tokens + request.sampling.max_tokens))

    def adopt(self, request: Request, pages: KVPages, on_output: Callable[[RequestOutput | BaseException], None]) -> Future:
        """Take over a request whose first output was made (``first_output``, unfinished) on the
        engine thread, and stream its next outputs to ``on_output`` (called on the engine thread;
        the last call has ``finished`` set, or is an exception). The future resolves once it is
        adopted. Cancelled before the engine thread gets to it, the request is never adopted;
        after, ``abort`` stops it (calls run in order)."""

        def counting(output):
            if not isinstance(output, BaseException):
                self.metrics.num_tokens_generated.inc(len(output.new_token_ids))
            on_output(output)

        def adopt(engine: Engine) -> None:
            self.loop.subscribe(request.request_id, counting)
            try:
                connector.import_prefilled(engine, request, pages)
            except BaseException:
                self.loop.unsubscribe(request.request_id)
                raise
            self._count_first_token(engine)

        return self.loop.call(adopt)

    def _count_first_token(self, engine: Engine) -> None:
        """Engine thread: a request taken on, with its first token."""
        self.metrics.num_requests.inc()
        self.metrics.num_tokens_generated.inc()

    def abort(self, request_id: str) -> None:
        self.loop.unsubscribe(request_id)
        self.loop.call(lambda engine: engine.abort(request_id))
