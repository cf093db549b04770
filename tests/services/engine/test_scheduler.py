"""Scheduler policy: token budget, image spans, encoder budget, waiting and preemption."""

from __future__ import annotations

import pytest
import torch

from services.engine.config import EngineConfig
from services.engine.encoder_cache_manager import EncoderCacheManager
from services.engine.engine import RequestRejectedError
from services.engine.kv.kv_cache_manager import KVCacheManager
from services.engine.request import MmFeature, Request, RequestStatus
from services.engine.sampling_params import SamplingParams
from services.engine.scheduler import Scheduler
from shared.types import PlaceholderRange
from tests.factories import chat_case, encode_image, make_image
from tests.oracle import assert_tokens_match
from tests.services.engine.conftest import GREEDY_16, oracle_tokens


def make_request(request_id: str, num_tokens: int, images: list[tuple[int, int]] = (), *, remote: bool = False) -> Request:
    """Images as (offset, length): with pixels to encode here, or ``remote`` (computed on another
    node, imported before they are computed over)."""
    pixels = None if remote else torch.zeros(1)
    return Request(
        request_id=request_id,
        prompt_token_ids=list(range(num_tokens)),
        sampling=SamplingParams(),
        mrope_positions=torch.arange(num_tokens).expand(3, -1),
        mrope_delta=0,
        mm_features=[MmFeature(f"{request_id}-img{i}", PlaceholderRange(o, n), (1, 2, 2 * n), pixels) for i, (o, n) in enumerate(images)],
    )


def make_scheduler(num_blocks=64, block_size=4, **config) -> Scheduler:
    cfg = EngineConfig(block_size=block_size, **config)
    return Scheduler(cfg, KVCacheManager(num_blocks, block_size), EncoderCacheManager(cfg.encoder_cache_tokens))


def _advance(scheduler: Scheduler, plan) -> None:
    for item in plan.scheduled:
        item.request.num_computed_tokens += item.num_new_tokens
        scheduler.release_finished_encoder_inputs(item.request)


def test_token_budget_is_shared_and_prefill_is_chunked():
    scheduler = make_scheduler(max_num_batched_tokens=10)
    a, b = make_request("a", 7), make_request("b", 7)
    scheduler.add(a)
    scheduler.add(b)
    plan = scheduler.schedule()
    assert [(s.request.request_id, s.num_new_tokens) for s in plan.scheduled] == [("a", 7), ("b", 3)]
    _advance(scheduler, plan)
    plan = scheduler.schedule()
    assert [(s.request.request_id, s.num_new_tokens) for s in plan.scheduled] == [("b", 4)]


def test_disable_chunked_mm_input_never_splits_an_image():
    for disable in (False, True):
        scheduler = make_scheduler(max_num_batched_tokens=8, disable_chunked_mm_input=disable)
        request = make_request("r", 20, images=[(5, 6)])  # image tokens [5, 11)
        scheduler.add(request)
        ends = []
        while request.num_computed_tokens < request.num_tokens:
            plan = scheduler.schedule()
            _advance(scheduler, plan)
            ends.append(request.num_computed_tokens)
        inside_image = [end for end in ends if 5 < end < 11]
        if disable:
            assert ends[0] == 5 and inside_image == []  # stops before the image, then takes it whole
        else:
            assert ends[0] == 8 and inside_image == [8]


def test_encoder_budget_per_step_defers_the_second_image():
    scheduler = make_scheduler(max_num_batched_tokens=100, max_encoder_tokens_per_step=8, encoder_cache_tokens=64)
    request = make_request("r", 40, images=[(2, 8), (20, 8)])
    scheduler.add(request)
    first = scheduler.schedule()
    assert first.scheduled[0].encoder_inputs == [0] and first.scheduled[0].num_new_tokens == 20
    _advance(scheduler, first)
    second = scheduler.schedule()
    assert second.scheduled[0].encoder_inputs == [1] and second.scheduled[0].num_new_tokens == 20


def test_a_remote_image_not_yet_imported_stops_the_range_before_it_until_it_is():
    scheduler = make_scheduler(max_num_batched_tokens=100, encoder_cache_tokens=64, max_encoder_tokens_per_step=64)
    request = make_request("r", 40, images=[(10, 8), (25, 8)], remote=True)
    scheduler.encoder_cache.allocate("r", "r-img0", 8)  # the first is imported, the second not yet
    scheduler.add(request)
    plan = scheduler.schedule()
    assert plan.scheduled[0].num_new_tokens == 25 and plan.scheduled[0].encoder_inputs == []
    assert request.awaiting_import == "r-img1"
    _advance(scheduler, plan)
    assert scheduler.schedule().scheduled == [] and request.awaiting_import == "r-img1"
    scheduler.encoder_cache.allocate("r", "r-img1", 8)
    plan = scheduler.schedule()
    assert plan.scheduled[0].num_new_tokens == 15 and request.awaiting_import is None


def test_a_waiting_request_awaiting_an_import_lets_the_next_one_go_first():
    scheduler = make_scheduler(max_num_batched_tokens=100)
    awaiting, ready = make_request("a", 20, images=[(0, 8)], remote=True), make_request("b", 12)
    scheduler.add(awaiting)
    scheduler.add(ready)
    plan = scheduler.schedule()
    assert [s.request for s in plan.scheduled] == [ready] and list(scheduler.waiting) == [awaiting]


def test_an_image_that_recurs_keeps_its_reference_until_its_last_occurrence_is_computed():
    scheduler = make_scheduler(max_num_batched_tokens=10, encoder_cache_tokens=64, max_encoder_tokens_per_step=64)
    request = make_request("r", 30, images=[(2, 4), (20, 4)])
    for feature in request.mm_features:
        feature.mm_hash = "same"  # one image, twice in the prompt
    scheduler.add(request)
    _advance(scheduler, scheduler.schedule())  # tokens [0, 10): past the first occurrence only
    assert "r" in scheduler.encoder_cache.mm_hash_to_requests["same"]
    _advance(scheduler, scheduler.schedule())
    _advance(scheduler, scheduler.schedule())  # [20, 30): past the second
    assert scheduler.encoder_cache.mm_hash_to_requests["same"] == set()


def test_request_that_does_not_fit_waits_until_blocks_free_up():
    scheduler = make_scheduler(num_blocks=6, block_size=4)
    a, b = make_request("a", 16), make_request("b", 12)
    scheduler.add(a)
    scheduler.add(b)
    plan = scheduler.schedule()
    assert [s.request.request_id for s in plan.scheduled] == ["a"] and b.status is RequestStatus.WAITING
    _advance(scheduler, plan)
    scheduler.finish(a, RequestStatus.FINISHED_STOPPED)
    assert [s.request.request_id for s in scheduler.schedule().scheduled] == ["b"]


def test_decode_pressure_preempts_the_newest_request():
    scheduler = make_scheduler(num_blocks=4, block_size=4)
    a, b = make_request("a", 8), make_request("b", 8)
    scheduler.add(a)
    scheduler.add(b)
    _advance(scheduler, scheduler.schedule())  # both prefilled: all 4 blocks used
    a.output_token_ids.append(1)
    b.output_token_ids.append(1)
    plan = scheduler.schedule()  # a needs a fifth block: b is preempted
    assert plan.preempted == [b] and [s.request for s in plan.scheduled] == [a]
    assert b.status is RequestStatus.WAITING and b.num_computed_tokens == 0 and scheduler.waiting[0] is b


def test_preempted_requests_still_match_the_oracle(make_llm, oracle):
    cases = [chat_case(encode_image(make_image(112, 112, seed=s)), "describe " * 4) for s in range(4)]
    llm = make_llm(block_size=4, num_kv_blocks=40)
    results = llm.generate([c.prompt for c in cases], GREEDY_16)
    assert llm.engine.scheduler.num_preemptions > 0
    for case, result in zip(cases, results):
        assert_tokens_match(result.token_ids, oracle_tokens(oracle, case))


def test_impossible_requests_are_rejected_up_front(make_llm):
    llm = make_llm(num_kv_blocks=4, block_size=4)
    prompt = chat_case("word " * 40).prompt
    with pytest.raises(RequestRejectedError, match="KV pages"):
        llm.generate([prompt], GREEDY_16)
    llm = make_llm(encoder_cache_tokens=32, max_encoder_tokens_per_step=32)
    with pytest.raises(RequestRejectedError, match="embedding rows"):
        llm.generate([chat_case(encode_image(make_image(224, 224, seed=1))).prompt], GREEDY_16)


def _adopted(scheduler: Scheduler, request_id: str, num_prompt_tokens: int = 8, max_tokens: int = 4) -> Request:
    """A request as connector.import_prefilled leaves it: its prompt's KV in place, every page it
    may need reserved, its first token already sampled."""
    request = make_request(request_id, num_prompt_tokens)
    request.sampling = SamplingParams(max_tokens=max_tokens)
    request.output_token_ids.append(1)
    request.num_computed_tokens = request.num_tokens - 1
    assert scheduler.kv.allocate(request, num_prompt_tokens + max_tokens - request.num_computed_tokens)
    scheduler.adopt(request)
    return request


def test_adopted_requests_wait_for_a_sequence_slot():
    scheduler = make_scheduler(max_num_seqs=2)
    a, b, c = (_adopted(scheduler, name) for name in "abc")
    plan = scheduler.schedule()
    assert [(s.request.request_id, s.num_new_tokens) for s in plan.scheduled] == [("a", 1), ("b", 1)]
    assert scheduler.running == [a, b] and list(scheduler.adopted) == [c] and scheduler.num_waiting() == 1
    _advance(scheduler, plan)
    b.output_token_ids.append(2)  # b's next token, sampled
    scheduler.finish(a, RequestStatus.FINISHED_STOPPED)
    plan = scheduler.schedule()
    assert [s.request.request_id for s in plan.scheduled] == ["b", "c"]
    assert scheduler.running == [b, c] and not scheduler.adopted


def test_an_adopted_request_aborted_while_waiting_frees_its_pages():
    scheduler = make_scheduler(max_num_seqs=1)
    free = scheduler.kv.pool.num_free_blocks
    running = _adopted(scheduler, "a")
    waiting = _adopted(scheduler, "b")
    assert [s.request for s in scheduler.schedule().scheduled] == [running]
    scheduler.finish(waiting, RequestStatus.FINISHED_ABORTED)
    assert not scheduler.adopted and waiting.request_id not in scheduler.kv.req_to_tables
    scheduler.finish(running, RequestStatus.FINISHED_ABORTED)
    assert scheduler.kv.pool.num_free_blocks == free and not scheduler.has_unfinished()
