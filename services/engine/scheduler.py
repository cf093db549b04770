"""Continuous-batching scheduler with chunked prefill (one step = one token budget).

Each step:
  0. adopted requests (imported with their KV already in place, every page they may need
     reserved) join the running ones while sequence slots remain, first come first served;
  1. running requests, in admission order: schedule their remaining tokens (1 when decoding, a
     chunk when a prefill was split); if KV cannot be allocated, preempt the most recently
     admitted running request (recompute mode: its blocks are freed and it rejoins the front of
     the waiting queue) and retry;
  2. waiting requests, first come first served, while budget and sequence slots remain: adopt
     the longest cached prefix, then schedule as many tokens as the budget allows. The head of
     the queue blocks the rest if it does not fit (no starvation of large requests), unless it
     cannot begin until an item computed elsewhere is imported: then the rest go first.
A hybrid model's prompt chunk ends at each point where its state is saved for prefix hits.
Images: a scheduled token range that reaches into an image's placeholder needs that image's
embeddings. They come from the encoder cache, or the image is scheduled for encoding if the
per-step encoder budget and the cache allow; otherwise the range stops before the image. An
item computed on another node (no pixels here) that is not imported yet also stops the range
before it: its node brings it as the cache frees room (services/prefill/embedding_feed.py). With
disable_chunked_mm_input, a range never ends inside an image's span.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from services.engine.config import EngineConfig
from services.engine.encoder_cache_manager import EncoderCacheManager
from services.engine.kv.block_pool import KVBlock
from services.engine.kv.kv_cache_manager import KVCacheManager
from services.engine.lora.slots import LoraSlots
from services.engine.request import Request, RequestStatus
from shared.node_metrics import Histogram


@dataclass(slots=True)
class ScheduledRequest:
    request: Request
    num_new_tokens: int
    encoder_inputs: list[int] = field(default_factory=list)  # indices into request.mm_features


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest]
    preempted: list[Request]

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    def __init__(
        self, config: EngineConfig, kv: KVCacheManager, encoder_cache: EncoderCacheManager, loras: LoraSlots | None = None
    ) -> None:
        self.config = config
        self.kv = kv
        self.encoder_cache = encoder_cache
        self.loras = loras
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.adopted: deque[Request] = deque()  # KV in place, waiting only for a sequence slot
        self.num_preemptions = 0
        # Declared here, where it is observed; the prefill and decode nodes export it.
        self.queue_time = Histogram("queue_seconds", "A request's wait from reaching the engine to its first scheduled step")

    def add(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def adopt(self, request: Request) -> None:
        """A request whose KV was computed elsewhere and whose pages are all reserved: it runs as
        soon as a sequence slot is free (max_num_seqs bounds the batch however requests arrive)."""
        request.status = RequestStatus.WAITING
        self.adopted.append(request)

    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.adopted)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.adopted)

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        encoder_budget = self.config.max_encoder_tokens_per_step
        scheduled: list[ScheduledRequest] = []
        preempted: list[Request] = []
        self._run_adopted()

        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            wanted = self._chunk(request, request.num_computed_tokens, budget)
            num_new, encode, encoder_budget_after = self._plan_encoder(request, request.num_computed_tokens, wanted, encoder_budget)
            if num_new == 0:
                index += 1
                continue
            while not self.kv.allocate(request, num_new):
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
            else:
                self._commit_encoder(request, encode)
                encoder_budget = encoder_budget_after
                scheduled.append(ScheduledRequest(request, num_new, encode))
                budget -= num_new
                index += 1
                continue
            break  # the request itself was preempted

        awaiting: list[Request] = []  # waiting on an import to begin: the rest go first
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs and not preempted:
            request = self.waiting[0]
            if not self._lora_admits(request):  # every slot holds an adapter in use: the others go first
                awaiting.append(self.waiting.popleft())
                continue
            cached: list[KVBlock] = self.kv.find_cached_prefix(request) if request.num_computed_tokens == 0 else []
            start = request.num_computed_tokens + len(cached) * self.kv.block_size
            wanted = self._chunk(request, start, budget)
            num_new, encode, encoder_budget_after = self._plan_encoder(request, start, wanted, encoder_budget)
            if num_new == 0 and request.awaiting_import is not None:
                awaiting.append(self.waiting.popleft())
                continue
            if num_new == 0 or not self.kv.allocate(request, num_new, cached):
                break
            self.waiting.popleft()
            self._admit_lora(request)
            self._commit_encoder(request, encode)
            encoder_budget = encoder_budget_after
            request.num_computed_tokens = start
            if request.num_cached_tokens is None:
                request.num_cached_tokens = min(start, request.num_prompt_tokens)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled.append(ScheduledRequest(request, num_new, encode))
            budget -= num_new
        self.waiting.extendleft(reversed(awaiting))
        self._record_queue_times(scheduled)
        return SchedulerOutput(scheduled, preempted)

    def _chunk(self, request: Request, start: int, budget: int) -> int:
        """Tokens to compute from ``start`` within the budget; a hybrid model's prompt chunk stops
        at the next point whose state is saved for prefix hits (KVCacheManager.is_state_point)."""
        wanted = min(request.num_tokens - start, budget)
        to_point = self.kv.tokens_to_state_point(request, start)
        return wanted if to_point is None else min(wanted, to_point)

    def _run_adopted(self) -> None:
        """Adopted requests join the running ones, first come first served, while sequence slots
        remain (and their LoRA adapter can hold a slot)."""
        while self.adopted and len(self.running) < self.config.max_num_seqs and self._lora_admits(self.adopted[0]):
            request = self.adopted.popleft()
            self._admit_lora(request)
            request.status = RequestStatus.RUNNING
            self.running.append(request)

    def _lora_admits(self, request: Request) -> bool:
        return self.loras is None or self.loras.can_admit(request)

    def _admit_lora(self, request: Request) -> None:
        if self.loras is not None:
            self.loras.admit(request)

    def _record_queue_times(self, scheduled: list[ScheduledRequest]) -> None:
        now = time.monotonic()
        for item in scheduled:
            if item.request.first_scheduled_s is None:
                item.request.first_scheduled_s = now
                self.queue_time.observe(now - item.request.arrival_s)

    def finish(self, request: Request, status: RequestStatus) -> None:
        request.status = status
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        elif request in self.adopted:
            self.adopted.remove(request)
        self.kv.free(request)
        self.encoder_cache.free_request(request.request_id, [f.mm_hash for f in request.mm_features])
        if self.loras is not None:
            self.loras.release(request)

    def release_finished_encoder_inputs(self, request: Request) -> None:
        """Drop this request's reference to images it has fully consumed: an image that recurs
        in the prompt only once its last occurrence is computed past."""
        last_end: dict[str, int] = {}
        for feature in request.mm_features:
            last_end[feature.mm_hash] = max(last_end.get(feature.mm_hash, 0), feature.placeholder.end)
        for mm_hash, end in last_end.items():
            if end <= request.num_computed_tokens:
                self.encoder_cache.free_encoder_input(request.request_id, mm_hash)

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        if self.loras is not None:
            self.loras.release(request)
        self.encoder_cache.free_request(request.request_id, [f.mm_hash for f in request.mm_features])
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        request.status = RequestStatus.WAITING
        self.waiting.appendleft(request)

    def _plan_encoder(self, request: Request, start: int, num_new: int, encoder_budget: int) -> tuple[int, list[int], int]:
        """(tokens that can run, features to encode, encoder budget left) for range [start, start+num_new)."""
        encode: list[int] = []
        planned_rows = 0
        request.awaiting_import = None
        for index, feature in enumerate(request.mm_features):
            lo, hi = feature.placeholder.offset, feature.placeholder.end
            if lo >= start + num_new:
                break
            if hi <= start:
                continue
            if self.config.disable_chunked_mm_input and hi > start + num_new:
                # Stop before the image rather than split it; what is left of an image a prefix hit
                # ended inside (lo < start) runs whole in a later step.
                return max(lo, start) - start, encode, encoder_budget
            if self.encoder_cache.check_and_update_cache(request.request_id, feature.mm_hash):
                continue
            if feature.pixel_values is None:
                request.awaiting_import = feature.mm_hash
                return max(0, lo - start), encode, encoder_budget
            rows = feature.num_embeds
            if rows > encoder_budget or not self.encoder_cache.can_allocate(planned_rows + rows):
                return max(0, lo - start), encode, encoder_budget
            encode.append(index)
            encoder_budget -= rows
            planned_rows += rows
        return num_new, encode, encoder_budget

    def _commit_encoder(self, request: Request, encode: list[int]) -> None:
        for index in encode:
            feature = request.mm_features[index]
            if not self.encoder_cache.check_and_update_cache(request.request_id, feature.mm_hash):
                self.encoder_cache.allocate(request.request_id, feature.mm_hash, feature.num_embeds)
