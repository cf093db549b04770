"""Prefill node: computes a prompt's KV (reusing its prefix cache), samples the first token, and
pushes the prompt's KV pages to the decode node's data address.

Embeddings: the node keeps its own embedding cache (the engine's encoder cache, with no vision
tower behind it). Items it lacks are pulled from the encoder node, which pushes them to this
node's inbox. Claims and imports run on the engine thread, and each holds a reference for the
request, so nothing it needs can be evicted before the request is scheduled.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, replace

import torch

from services.engine.config import EngineConfig
from services.engine.engine import Engine
from services.engine.engine_node import EngineNode
from services.engine.remote_request import PromptItem
from services.engine.request import Request
from services.transport.tensor_channel import TensorSender
from shared.index.publisher import IndexPublisher
from shared.models.registry import ModelRef


class EmbeddingsUnavailableError(RuntimeError):
    def __init__(self, missing: list[str]) -> None:
        super().__init__(f"embeddings unavailable for {len(missing)} image(s)")
        self.missing = missing


@dataclass(frozen=True, slots=True)
class PrefillResult:
    first_token_id: int
    num_cached_tokens: int
    mrope_delta: int


class PrefillNode(EngineNode):
    def __init__(self, model: ModelRef, config: EngineConfig, *, data_bind: str, embedding_wait_s: float = 30.0, prefill_timeout_s: float = 600.0, publisher: IndexPublisher | None = None) -> None:
        super().__init__(model, config, data_bind=data_bind, publisher=publisher)
        self.sender = TensorSender()
        self.embedding_wait_s = embedding_wait_s
        self.prefill_timeout_s = prefill_timeout_s
        self._decode_targets: dict[str, str] = {}
        self.engine.finish_listeners.append(self._ship_kv)
        self.num_embeddings_pulled = 0
        self.num_tokens_computed = 0
        self.num_cached_tokens = 0
        self.start_loop()

    def claim_local_embeddings(self, request_id: str, items: list[PromptItem]) -> list[PromptItem]:
        """Reference the items this node already holds; returns those it lacks."""

        def claim(engine: Engine) -> list[PromptItem]:
            return [i for i in items if not engine.encoder_cache.check_and_update_cache(request_id, i.mm_hash)]

        return self.loop.call(claim).result()

    def receive_embeddings(self, request_id: str, items: list[PromptItem]) -> None:
        """Wait for pushed embeddings of ``items`` and import them; raises if any never arrive."""
        missing = []
        for item in items:
            message = self.inbox.wait(item.mm_hash, self.embedding_wait_s)
            if message is None:
                missing.append(item.mm_hash)
                continue
            embeds = message.tensors["embeds"]
            if embeds.shape[0] != item.placeholder.length:
                raise ValueError(f"embeddings for {item.mm_hash} have {embeds.shape[0]} rows, expected {item.placeholder.length}")
            if not self.loop.call(lambda engine, i=item, e=embeds: engine.import_embeddings(request_id, i.mm_hash, e)).result():
                raise RuntimeError("prefill node's embedding cache is full; retry later")
            self.num_embeddings_pulled += 1
        if missing:
            raise EmbeddingsUnavailableError(missing)

    def release(self, request_id: str, items: list[PromptItem]) -> None:
        self.loop.call(lambda engine: engine.encoder_cache.free_request(request_id, [i.mm_hash for i in items]))

    def prefill(self, request: Request, decode_address: str) -> PrefillResult:
        """Run the prompt (embeddings already claimed) and ship its KV; blocks until done."""
        # Only the first token is sampled here (with the request's own sampling settings); stop
        # conditions are the decode node's job.
        request.sampling = replace(request.sampling, max_tokens=1, stop=(), stop_token_ids=(), ignore_eos=True)
        done: Future = Future()
        self._decode_targets[request.request_id] = decode_address
        self.loop.subscribe(request.request_id, lambda out: done.set_exception(out) if isinstance(out, BaseException) else done.set_result(out))
        try:
            self.loop.call(lambda engine: engine.add(request)).result()
            output = done.result(timeout=self.prefill_timeout_s)
        except BaseException:
            self._decode_targets.pop(request.request_id, None)
            self.loop.unsubscribe(request.request_id)
            self.loop.call(lambda engine: engine.abort(request.request_id))
            raise
        self.num_cached_tokens += output.num_cached_tokens
        self.num_tokens_computed += request.num_prompt_tokens - output.num_cached_tokens
        return PrefillResult(output.new_token_ids[0], output.num_cached_tokens, request.mrope_delta)

    def _ship_kv(self, request: Request, block_ids: list[int]) -> None:
        """Engine-thread hook: push the prompt's KV pages before the blocks are released."""
        target = self._decode_targets.pop(request.request_id, None)
        if target is None:
            return
        num_blocks = -(-request.num_prompt_tokens // self.engine.config.block_size)
        pages = self.engine.kv_pages(block_ids[:num_blocks])
        tensors: dict[str, torch.Tensor] = {}
        for layer, (k, v) in enumerate(pages):
            tensors[f"k{layer}"] = k
            tensors[f"v{layer}"] = v
        self.sender.send(target, request.request_id, tensors, {"num_prompt_tokens": request.num_prompt_tokens})

    def counters(self) -> dict[str, float]:
        return {
            "prefill_embeddings_pulled_total": float(self.num_embeddings_pulled),
            "prefill_kv_bytes_sent_total": float(self.sender.num_bytes_sent),
            "prefill_tokens_computed_total": float(self.num_tokens_computed),
            "prefix_cached_tokens_total": float(self.num_cached_tokens),
        }

    def close(self) -> None:
        super().close()
        self.sender.close()
