"""Decode node: adopts requests whose prompt KV arrives from a prefill node, and decodes them
with continuous batching. A cancelled stream aborts its request, which frees its KV pages."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from services.engine import connector
from services.engine.config import EngineConfig
from services.engine.engine import Engine
from services.engine.engine_node import EngineNode
from services.engine.output_processor import RequestOutput
from services.engine.request import Request
from services.engine.sampling import TokenLogprobs
from services.transport.tensor_channel import OPEN_CHANNEL, ChannelAuth
from shared.index.publisher import IndexPublisher
from shared.liveness import Liveness
from shared.models.registry import ModelRef


class KVTransferTimeoutError(RuntimeError):
    pass


class DecodeNode(EngineNode):
    def __init__(
        self,
        model: ModelRef,
        config: EngineConfig,
        *,
        data_bind: str,
        kv_wait_s: float = 60.0,
        publisher: IndexPublisher | None = None,
        liveness: Liveness | None = None,
        channel_auth: ChannelAuth = OPEN_CHANNEL,
    ) -> None:
        super().__init__(model, config, data_bind=data_bind, publisher=publisher, liveness=liveness, channel_auth=channel_auth)
        self.kv_wait_s = kv_wait_s
        self.num_requests = 0
        self.num_tokens_generated = 0

    def start(
        self,
        request: Request,
        first_token: int,
        on_output: Callable[[RequestOutput | BaseException], None],
        first_token_logprobs: TokenLogprobs | None = None,
    ) -> None:
        """Wait for the prompt's KV pages, adopt the request, and stream outputs to ``on_output``
        (called on the engine thread; the last call has ``finished`` set, or is an exception)."""
        pages = self.receive_pages(request.request_id, self.kv_wait_s)
        if pages is None:
            raise KVTransferTimeoutError(f"KV pages for {request.request_id} did not arrive within {self.kv_wait_s}s")

        def counting(output):
            if not isinstance(output, BaseException):
                self.num_tokens_generated += len(output.new_token_ids)
            on_output(output)

        def adopt(engine: Engine) -> None:
            self.loop.subscribe(request.request_id, counting)
            try:
                final = connector.import_prefilled(engine, request, first_token, pages)
            except BaseException:
                self.loop.unsubscribe(request.request_id)
                raise
            first_logprobs = [first_token_logprobs] if first_token_logprobs is not None else []
            if final is not None:
                self.loop.unsubscribe(request.request_id)
                counting(replace(final, new_logprobs=first_logprobs))
            else:  # the first token came from the prefill node; stream it like any other
                counting(engine.outputs.snapshot(request, [first_token], first_logprobs))

        self.loop.call(adopt).result()
        self.num_requests += 1

    def abort(self, request_id: str) -> None:
        self.loop.unsubscribe(request_id)
        self.loop.call(lambda engine: engine.abort(request_id))

    def counters(self) -> dict[str, float]:
        return {
            "decode_requests_total": float(self.num_requests),
            "decode_tokens_generated_total": float(self.num_tokens_generated),
            "decode_kv_blocks_free": float(self.engine.kv.pool.num_free_blocks),
            "kv_blocks_exported_total": float(self.num_kv_blocks_exported),
            **self.inbox.counters(),
            **self.cache_gauges(),
        }
