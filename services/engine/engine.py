"""The single-process engine: ``step() = schedule -> run -> postprocess``.

Admission checks make "a request that does not fit waits, never crashes" hold: anything that
could never be scheduled (more KV blocks than the pool, an image larger than the encoder cache
or the per-step encoder budget) is rejected up front with a clear error instead of waiting
forever.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from services.engine.config import EngineConfig
from services.engine.encoder_cache_manager import EncoderCacheManager
from services.engine.kv.kv_cache_manager import KVCacheManager
from services.engine.model_runner import ModelRunner
from services.engine.output_processor import OutputProcessor, RequestOutput
from services.engine.request import MmFeature, Request, RequestStatus
from services.engine.sampling import Sampler, SamplingParams
from services.engine.scheduler import Scheduler
from services.preprocess import PreprocessedRequest
from shared.models.registry import ModelRef
from shared.types import BlockHash


class RequestRejectedError(ValueError):
    """The request can never run under this engine's configuration."""


class Engine:
    def __init__(self, model: ModelRef, config: EngineConfig | None = None, *, tokenizer=None, load_vision: bool = True) -> None:
        self.config = config or EngineConfig()
        self.runner = ModelRunner(model, self.config, load_vision=load_vision)
        self.kv = KVCacheManager(self.runner.num_kv_blocks, self.config.block_size, enable_caching=self.config.enable_prefix_caching)
        self.encoder_cache = EncoderCacheManager(self.config.encoder_cache_tokens)
        self.scheduler = Scheduler(self.config, self.kv, self.encoder_cache)
        self.sampler = Sampler()
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(model.path))
        self.outputs = OutputProcessor(tokenizer, self.runner.checkpoint.eos_token_ids)
        self.requests: dict[str, Request] = {}
        self.num_steps = 0
        # Called as fn(request, block_ids) when a request finishes, before its KV is released.
        self.finish_listeners: list[Callable[[Request, list[int]], None]] = []

    # -- requests ---------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: PreprocessedRequest, sampling: SamplingParams, *, cache_salt: str | None = None) -> None:
        request = Request(
            request_id=request_id,
            prompt_token_ids=list(prompt.prompt_token_ids),
            sampling=sampling,
            mrope_positions=prompt.mrope_positions,
            mrope_delta=prompt.mrope_delta,
            mm_features=[
                MmFeature(item.mm_hash, item.placeholder, item.image.grid_thw, item.image.pixel_values) for item in prompt.mm_items
            ],
            cache_salt=cache_salt,
        )
        self.add(request)

    def add(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        self._check_admissible(request)
        self.requests[request.request_id] = request
        self.scheduler.add(request)

    # -- disaggregation hooks ----------------------------------------------------------------
    def import_embeddings(self, request_id: str, identifier: str, embeds: torch.Tensor) -> bool:
        """Make an image's embeddings resident for ``request_id`` (computed elsewhere). Returns
        False if the encoder cache has no room right now."""
        if self.encoder_cache.check_and_update_cache(request_id, identifier):
            return True
        if not self.encoder_cache.can_allocate(embeds.shape[0]):
            return False
        self.encoder_cache.allocate(request_id, identifier, embeds.shape[0])
        self.runner.encoder_outputs[identifier] = embeds.to(self.runner.device, self.runner.dtype)
        self._sync_encoder_outputs()
        return True

    def import_prefilled(
        self, request: Request, first_token: int, kv_pages: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> RequestOutput | None:
        """Adopt a request whose prompt KV was computed elsewhere, continuing from its first
        token. Every block it may ever need is reserved now, so it can never be preempted (a
        decode node could not recompute a prompt whose images it does not hold). Returns the
        final output if the first token already finishes the request.

        A migrated request arrives with ``output_token_ids`` already holding the answer sent so
        far: ``kv_pages`` then cover the prompt and those tokens, and ``first_token`` follows them.
        """
        self._check_admissible(request)
        num_known_tokens = request.num_tokens  # all of them have KV in kv_pages
        status = self.outputs.append_token(request, first_token)
        if status is not None:
            request.status = status
            return self.outputs.snapshot(request, [first_token])
        worst_case = request.num_prompt_tokens + request.sampling.max_tokens
        if not self.kv.allocate(request, worst_case):
            raise RequestRejectedError("decode node has no free KV pages for this request; retry later")
        table = self.kv.block_table(request)
        num_prompt_blocks = kv_pages[0][0].shape[0]
        ids = torch.tensor(table[:num_prompt_blocks], dtype=torch.long, device=self.runner.device)
        for (k_cache, v_cache), (k_pages, v_pages) in zip(self.runner.kv_caches, kv_pages):
            k_cache.index_copy_(0, ids, k_pages.to(k_cache.device, k_cache.dtype))
            v_cache.index_copy_(0, ids, v_pages.to(v_cache.device, v_cache.dtype))
        request.num_computed_tokens = num_known_tokens
        self.kv.cache_computed_blocks(request)
        request.status = RequestStatus.RUNNING
        self.requests[request.request_id] = request
        self.scheduler.running.append(request)
        return None

    def kv_pages(self, block_ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.runner.device)
        return [(k.index_select(0, ids), v.index_select(0, ids)) for k, v in self.runner.kv_caches]

    def num_cached_blocks(self, hashes: list[BlockHash]) -> int:
        """How many leading blocks of ``hashes`` this engine's prefix cache holds."""
        count = 0
        for block_hash in hashes:
            if self.kv.pool.lookup(block_hash) is None:
                break
            count += 1
        return count

    def export_kv_prefix(self, hashes: list[BlockHash]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of the pages of the leading blocks of ``hashes`` held here (every layer's K and
        V, shaped (num_blocks, block_size, kv_heads, head_dim)); empty lists if none is held."""
        num = self.num_cached_blocks(hashes)
        return self.kv_pages([self.kv.pool.lookup(h).block_id for h in hashes[:num]])

    def import_kv_blocks(self, hashes: list[BlockHash], pages: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
        """File pages computed elsewhere under their block hashes as cached prefix blocks, so the
        next prefix lookup finds them. Blocks already held are skipped; stops when the pool has
        no free block. Returns the number of blocks imported."""
        num_imported = 0
        for index, block_hash in enumerate(hashes):
            if self.kv.pool.lookup(block_hash) is not None:
                continue
            block = self.kv.pool.import_block(block_hash)
            if block is None:
                break
            for (k_cache, v_cache), (k_pages, v_pages) in zip(self.runner.kv_caches, pages):
                k_cache[block.block_id].copy_(k_pages[index])
                v_cache[block.block_id].copy_(v_pages[index])
            num_imported += 1
        return num_imported

    def abort(self, request_id: str) -> None:
        request = self.requests.pop(request_id, None)
        if request is not None:
            self.scheduler.finish(request, RequestStatus.FINISHED_ABORTED)
            self.sampler.forget(request_id)
            self._sync_encoder_outputs()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the loop -----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        plan = self.scheduler.schedule()
        if not plan.scheduled:
            return []
        self.num_steps += 1
        result = self.runner.execute(plan, self.kv)
        sampled = (
            self.sampler.sample(result.logits, [r.request_id for r in result.requests], [r.sampling for r in result.requests])
            if result.requests
            else []
        )
        token_for = dict(zip((r.request_id for r in result.requests), sampled))
        outputs = []
        for item in plan.scheduled:
            request = item.request
            request.num_computed_tokens += item.num_new_tokens
            self.kv.cache_computed_blocks(request)
            self.scheduler.release_finished_encoder_inputs(request)
            new_tokens: list[int] = []
            if request.request_id in token_for:
                token = token_for[request.request_id]
                new_tokens.append(token)
                status = self.outputs.append_token(request, token)
                if status is not None:
                    for listener in self.finish_listeners:
                        listener(request, self.kv.block_table(request))
                    self.scheduler.finish(request, status)
                    self.requests.pop(request.request_id, None)
                    self.sampler.forget(request.request_id)
            if new_tokens:
                outputs.append(self.outputs.snapshot(request, new_tokens))
        self._sync_encoder_outputs()
        return outputs

    def run_to_completion(self) -> Iterator[RequestOutput]:
        while self.has_unfinished():
            yield from self.step()

    # -- internals ------------------------------------------------------------------------------
    def _sync_encoder_outputs(self) -> None:
        self.runner.drop_encoder_outputs(self.encoder_cache.drain_evicted())

    def _check_admissible(self, request: Request) -> None:
        total = request.num_prompt_tokens + request.sampling.max_tokens
        if total > self.config.max_model_len:
            raise RequestRejectedError(
                f"prompt ({request.num_prompt_tokens} tokens) plus max_tokens ({request.sampling.max_tokens}) "
                f"exceeds the model length limit of {self.config.max_model_len}"
            )
        if self.kv.blocks_needed(total) > self.runner.num_kv_blocks:
            raise RequestRejectedError(
                f"request needs {self.kv.blocks_needed(total)} KV blocks but the pool has {self.runner.num_kv_blocks}"
            )
        for feature in request.mm_features:
            limit = min(self.config.encoder_cache_tokens, self.config.max_encoder_tokens_per_step)
            if feature.num_embeds > limit:
                raise RequestRejectedError(f"an image needs {feature.num_embeds} embedding rows; the encoder limit is {limit}")
            if self.config.disable_chunked_mm_input and feature.num_embeds > self.config.max_num_batched_tokens:
                raise RequestRejectedError(
                    f"an image spans {feature.num_embeds} tokens, more than max_num_batched_tokens "
                    f"({self.config.max_num_batched_tokens}), and disable_chunked_mm_input forbids splitting it"
                )
