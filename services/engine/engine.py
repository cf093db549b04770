"""The single-process engine: ``step() = schedule -> run -> postprocess``.

Importing and exporting embeddings and KV pages computed on other nodes lives beside it, in
connector.py. Admission checks make "a request that does not fit waits, never crashes" hold: anything that
could never be scheduled (more KV blocks than the pool, an image larger than the encoder cache
or the per-step encoder budget) is rejected up front with a clear error instead of waiting
forever.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator

from services.engine.config import EngineConfig
from services.engine.encoder_cache_manager import EncoderCacheManager
from services.engine.kv.kv_cache_manager import KVCacheManager
from services.engine.lora.slots import LoraSlots
from services.engine.model_runner import ModelRunner, StepHidden
from services.engine.output_processor import OutputProcessor, RequestOutput
from services.engine.pooler import PoolingTask, PoolState, pool
from services.engine.prompt_logprobs import record_prompt_logprobs
from services.engine.request import MmFeature, Request, RequestStatus
from services.engine.sampling import Sampler, SamplingError
from services.engine.sampling_params import SamplingParams, TokenLogprobs
from services.engine.scheduler import Scheduler
from services.engine.structured_output import GrammarError, Grammars
from services.models.lora.adapter import LoraAdapter
from services.models.pooling import check_dimensions, read_pooling_config
from services.models.registry import ModelRef
from services.models.tokenizer import load_tokenizer
from services.preprocess.preprocessor import PreprocessedRequest


class RequestRejectedError(ValueError):
    """The request can never run under this engine's configuration."""


class Engine:
    def __init__(self, model: ModelRef, config: EngineConfig | None = None, *, tokenizer=None, load_vision: bool = True) -> None:
        self.config = config or EngineConfig()
        if model.family.bidirectional_images:
            # An image's tokens see each other both ways: a chunk holding part of one would compute
            # its first tokens without the rest, so what is left of an image is never split (as
            # vLLM forces too).
            self.config = dataclasses.replace(self.config, disable_chunked_mm_input=True)
        self.runner = ModelRunner(model, self.config, load_vision=load_vision)
        self.model_name = model.name
        self.kv = KVCacheManager(
            self.runner.num_kv_blocks,
            self.config.block_size,
            enable_caching=self.config.enable_prefix_caching,
            layout=self.runner.layout,
            max_chunk_tokens=self.config.max_num_batched_tokens,
            state_slots=self.runner.num_state_slots,
            state_snapshots=self.runner.num_state_snapshots,
            state_interval_blocks=self.config.state_interval_tokens // self.config.block_size,
        )
        self.encoder_cache = EncoderCacheManager(self.config.encoder_cache_tokens)
        self.loras = LoraSlots(self.config.max_loras) if self.config.enable_lora else None
        self.scheduler = Scheduler(self.config, self.kv, self.encoder_cache, self.loras)
        eos_token_ids = self.runner.checkpoint.eos_token_ids
        self.sampler = Sampler(frozenset(eos_token_ids), vocab_size=self.runner.checkpoint.shape.vocab_size)
        if tokenizer is None:
            tokenizer = load_tokenizer(model.path)
        self.outputs = OutputProcessor(tokenizer, eos_token_ids)
        self.grammars = Grammars(tokenizer, self.runner.checkpoint.shape.vocab_size, eos_token_ids)
        checkpoint = self.runner.checkpoint
        self.pooling = read_pooling_config(model.path, checkpoint.hf, checkpoint.text.hidden_size)  # for embedding requests
        self.requests: dict[str, Request] = {}
        self._failures: list[tuple[str, Exception]] = []
        self.num_steps = 0
        self.num_aborted = 0  # requests stopped unfinished: their caller left or ran out of time, or their step failed
        # Called as fn(request) when a request finishes, before its KV pages are released.
        self.finish_listeners: list[Callable[[Request], None]] = []

    # -- requests ---------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: PreprocessedRequest,
        sampling: SamplingParams,
        *,
        cache_salt: str | None = None,
        lora: LoraAdapter | None = None,
        pooling: PoolingTask | None = None,
    ) -> None:
        """``pooling``: an embedding request (pooling_task), which ends at its prompt's end."""
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
            lora=lora,
            pooling=pooling,
        )
        self.add(request)

    def pooling_task(self, dimensions: int | None = None) -> PoolingTask:
        """An embedding request's pooling: the checkpoint's (services/models/pooling.py), cut to
        ``dimensions`` where the model allows it (vLLM's checks and messages)."""
        try:
            check_dimensions(self.pooling, self.model_name, dimensions)
        except ValueError as exc:
            raise RequestRejectedError(str(exc)) from None
        return PoolingTask(self.pooling.kind, self.pooling.normalize, dimensions)

    def add(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        if request.lora is not None and self.loras is None:
            raise RequestRejectedError(
                f"LoRA adapter {request.lora.name!r} asked for, but this engine serves none (start it with --enable-lora)"
            )
        self.check_admissible(request)
        self.start_grammar(request)
        self.requests[request.request_id] = request
        self.scheduler.add(request)

    def start_grammar(self, request: Request) -> None:
        """Compile the request's structured-output constraint, if it has one, past the tokens it
        already has. Every way into the engine calls this (add, connector.import_prefilled)."""
        if request.sampling.structured is None:
            return
        try:
            self.grammars.add(request.request_id, request.sampling.structured, request.output_token_ids)
        except GrammarError as exc:
            raise RequestRejectedError(str(exc)) from None

    def abort(self, request_id: str) -> None:
        request = self.requests.pop(request_id, None)
        if request is not None:
            self.num_aborted += 1
            self.scheduler.finish(request, RequestStatus.FINISHED_ABORTED)
            self._forget(request_id)
            self.sync_encoder_outputs()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the loop -----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """schedule -> run the model -> sample -> advance each scheduled request."""
        plan = self.scheduler.schedule()
        if not plan.scheduled:
            return []
        self.num_steps += 1
        masks = self.grammars.start_masks([item.request.request_id for item in plan.scheduled])  # beside the forward pass
        allowed_for = functools.cache(masks.result) if masks is not None else None
        sampling = self.runner.execute(plan, self.kv, self.loras)
        for rows in sampling.prompt_rows:
            record_prompt_logprobs(rows, self.runner.decoder.compute_logits)
        embeddings = self._pool(sampling)
        chosen = self.sampler.choose(sampling.hidden, sampling.requests, self.runner.decoder, allowed_for)
        token_for, logprobs_for = chosen.token_for, chosen.logprobs_for
        outputs = []
        for item in plan.scheduled:
            request = item.request
            request.num_computed_tokens += item.num_new_tokens
            self.kv.cache_computed_blocks(request)
            self.scheduler.release_finished_encoder_inputs(request)
            token = token_for.get(request.request_id)
            if request.request_id in embeddings:
                outputs.append(self._finish_pooled(request, embeddings[request.request_id]))
            elif isinstance(token, SamplingError):
                self._fail(request, token)
            elif token is not None:
                outputs.append(self._append(request, token, logprobs_for.get(request.request_id)))
        self.sync_encoder_outputs()
        return outputs

    def _append(self, request: Request, token: int, logprobs: TokenLogprobs | None) -> RequestOutput:
        grammar_complete = self.grammars.accept(request.request_id, token)
        status = self.outputs.append_token(request, token)
        if status is None and grammar_complete:
            status = self.outputs.finish_stopped(request)
        if status is not None:
            self._finish(request, status)
        return self.outputs.snapshot(request, [token], [logprobs] if logprobs is not None else [])

    def _finish(self, request: Request, status: RequestStatus) -> None:
        """A request done: its listeners (a prefill node ships its KV) before its blocks are released."""
        for listener in self.finish_listeners:
            listener(request)
        self.scheduler.finish(request, status)
        self.requests.pop(request.request_id, None)
        self._forget(request.request_id)

    def _pool(self, sampling: StepHidden) -> dict[str, list[float]]:
        """Embedding requests whose prompt this step completed: their embeddings, and they leave
        ``sampling`` (nothing is sampled for them). CLS / MEAN rows are gathered first."""
        for rows in sampling.pool_rows:
            if rows.request.pool_state is None:
                rows.request.pool_state = PoolState()
            rows.request.pool_state.add(rows.start, rows.hidden)
        pooled = [i for i, r in enumerate(sampling.requests) if r.pooling is not None]
        if not pooled:
            return {}
        embeddings = {}
        for i in pooled:
            request = sampling.requests[i]
            assert request.pooling is not None
            embeddings[request.request_id] = pool(request.pooling, sampling.hidden[i], request.pool_state)
        kept = [i for i in range(len(sampling.requests)) if i not in set(pooled)]
        sampling.requests = [sampling.requests[i] for i in kept]
        sampling.hidden = sampling.hidden[kept] if kept else sampling.hidden[:0]
        return embeddings

    def _finish_pooled(self, request: Request, embedding: list[float]) -> RequestOutput:
        """An embedding request ends at its prompt's end: no token, its KV kept as any prompt's."""
        self._finish(request, RequestStatus.FINISHED_STOPPED)
        return dataclasses.replace(self.outputs.snapshot(request, []), embedding=embedding)

    def _fail(self, request: Request, error: Exception) -> None:
        self.scheduler.finish(request, RequestStatus.FINISHED_ABORTED)
        self.requests.pop(request.request_id, None)
        self._forget(request.request_id)
        self._failures.append((request.request_id, error))

    def _forget(self, request_id: str) -> None:
        self.sampler.forget(request_id)
        self.grammars.forget(request_id)

    def take_failures(self) -> list[tuple[str, Exception]]:
        """Requests that failed on their own in the last steps (request id, why), once each.
        They are already finished and freed; the caller tells their clients."""
        failures, self._failures = self._failures, []
        return failures

    def run_to_completion(self) -> Iterator[RequestOutput]:
        while self.has_unfinished():
            yield from self.step()

    # -- shared with connector.py ---------------------------------------------------------------
    def sync_encoder_outputs(self) -> None:
        """Drop the embeddings of items the encoder cache evicted."""
        self.runner.drop_encoder_outputs(self.encoder_cache.drain_evicted())

    def check_admissible(self, request: Request) -> None:
        # A token id outside the embedding table would fail the whole batch's step, not just this
        # request: nodes take token ids from the wire, so they are checked here, once.
        vocab_size = self.runner.checkpoint.shape.vocab_size
        token_ids = request.token_ids()
        if token_ids and not 0 <= min(token_ids) <= max(token_ids) < vocab_size:
            bad = next(t for t in token_ids if not 0 <= t < vocab_size)
            raise RequestRejectedError(f"token id {bad} is outside the vocabulary of {vocab_size}")
        _check_named_tokens(request.sampling, vocab_size)
        # An embedding request generates nothing: its prompt alone must fit.
        total = request.num_prompt_tokens + (0 if request.pooling is not None else request.sampling.max_tokens)
        if total > self.config.max_model_len:
            raise RequestRejectedError(
                f"prompt ({request.num_prompt_tokens} tokens) plus max_tokens ({request.sampling.max_tokens}) "
                f"exceeds the model length limit of {self.config.max_model_len}"
            )
        if self.kv.pages_needed(total) > self.runner.num_kv_blocks:
            raise RequestRejectedError(f"request needs {self.kv.pages_needed(total)} KV pages but the pool has {self.runner.num_kv_blocks}")
        for feature in request.mm_features:
            limit = min(self.config.encoder_cache_tokens, self.config.max_encoder_tokens_per_step)
            if feature.num_embeds > limit:
                raise RequestRejectedError(f"an image needs {feature.num_embeds} embedding rows; the encoder limit is {limit}")
            if self.config.disable_chunked_mm_input and feature.num_embeds > self.config.max_num_batched_tokens:
                raise RequestRejectedError(
                    f"an image spans {feature.num_embeds} tokens, more than max_num_batched_tokens "
                    f"({self.config.max_num_batched_tokens}), and disable_chunked_mm_input forbids splitting it"
                )


def _check_named_tokens(sampling: SamplingParams, vocab_size: int) -> None:
    """The token ids the sampling names index the logits row: each must be in the vocabulary."""
    named = {
        "logit_bias": [token for token, _ in sampling.logit_bias],
        "allowed_token_ids": sampling.allowed_token_ids or (),
        "logprob_token_ids": sampling.logprob_token_ids or (),
    }
    for field, tokens in named.items():
        outside = [token for token in tokens if not 0 <= token < vocab_size]
        if outside:
            raise RequestRejectedError(f"{field} names token id {outside[0]}, outside the vocabulary of {vocab_size}")
    for field in ("logprobs", "prompt_logprobs"):
        if (asked := getattr(sampling, field)) is not None and asked > vocab_size:
            raise RequestRejectedError(f"{field} asks for {asked} alternatives; the vocabulary has {vocab_size}")
