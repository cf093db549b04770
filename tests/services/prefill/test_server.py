"""The Prefill servicer over a real prefill node: a call that goes away mid-prefill (the gateway
cancelled it, or its deadline passed) aborts its engine request, so the engine stops computing a
prompt nobody waits for and ships no KV pages; a request that fails on its own (its sampling, a
token outside the vocabulary) fails alone with a clear status, and the node goes on serving; the
encoder call a prefill makes gets what is left of the prefill call's deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import pytest

from protos.gen import pb, rpc
from services.engine.config import EngineConfig
from services.engine.sampling import Sampler
from services.engine.sampling_params import SamplingParams
from services.engine.sampling_wire import sampling_to_pb
from services.prefill.node import PrefillNode
from services.prefill.server import PrefillServicer
from services.transport.internal_auth import InternalAuth
from services.transport.node_admission import NodeAdmission
from services.transport.node_error import ErrorKind, node_error_of
from services.transport.tensor_channel import TensorInbox
from tests.aio_server import serving

POISON_SEED = 666


def _prompt(seed: int, num_tokens: int = 8192) -> list[int]:
    """A prompt of its own (no prefix-cache hit from another test). At 16 tokens a step, 8192
    tokens take 512 engine steps: long enough to go away mid-way."""
    return [10 + (i * 7 + seed * 131) % 1000 for i in range(num_tokens)]


@pytest.fixture(scope="module")
def prefill(tiny_model):
    node = PrefillNode(tiny_model, EngineConfig(max_num_batched_tokens=16), data_bind="tcp://127.0.0.1:0")
    sink = TensorInbox("tcp://127.0.0.1:0")  # stands in for a decode node's inbox
    yield node, sink
    sink.close()
    node.close()


def _request(request_id: str, sink: TensorInbox, token_ids: list[int], sampling: SamplingParams | None = None) -> pb.PrefillRequest:
    return pb.PrefillRequest(
        request_id=request_id,
        prompt_token_ids=token_ids,
        decode_data_address=sink.address,
        sampling=sampling_to_pb(sampling or SamplingParams(max_tokens=4)),
    )


async def _engine_requests(node: PrefillNode) -> list[str]:
    return await asyncio.wrap_future(node.loop.call(lambda engine: list(engine.requests)))


async def _until(condition: Callable[[], object], timeout_s: float = 60.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not await condition():
            await asyncio.sleep(0.02)


def _run(prefill, scenario) -> None:
    node, sink = prefill
    admission = NodeAdmission("prefill")
    servicer = PrefillServicer(node, InternalAuth(), admission)

    async def main() -> None:
        async with serving(lambda server: rpc.add_PrefillServicer_to_server(servicer, server)) as channel:
            await scenario(rpc.PrefillStub(channel), node, sink)
        assert admission.num_pending == 0

    asyncio.run(main())


def test_a_call_cancelled_mid_prefill_aborts_its_engine_request_and_ships_nothing(prefill):
    async def scenario(stub, node: PrefillNode, sink: TensorInbox) -> None:
        call = stub.Prefill(_request("cancelled", sink, _prompt(1)))
        await _until(lambda: _has(node, "cancelled"))
        aborted = node.metrics.engine.num_requests_aborted.value
        call.cancel()
        await _until(lambda: _is_idle(node))
        assert node.metrics.engine.num_requests_aborted.value == aborted + 1
        assert sink.wait("cancelled", 1.0) is None  # finished, it would have shipped its pages

    _run(prefill, scenario)


def test_a_call_past_its_deadline_mid_prefill_aborts_its_engine_request(prefill):
    async def scenario(stub, node: PrefillNode, sink: TensorInbox) -> None:
        aborted = node.metrics.engine.num_requests_aborted.value
        call = asyncio.ensure_future(stub.Prefill(_request("expired", sink, _prompt(2)), timeout=1.5))
        await _until(lambda: _has(node, "expired"))
        with pytest.raises(grpc.aio.AioRpcError) as expired:
            await call
        assert expired.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await _until(lambda: _is_idle(node))
        assert node.metrics.engine.num_requests_aborted.value == aborted + 1
        assert sink.wait("expired", 1.0) is None
        # The node goes on: the next prefill runs and ships its pages.
        reply = await stub.Prefill(_request("after", sink, _prompt(3, 64)), timeout=60)
        assert reply.first_token_id >= 0 and sink.wait("after", 10.0) is not None

    _run(prefill, scenario)


class PoisonedSampler(Sampler):
    """Fails as on NaN logits for requests seeded POISON_SEED (with top_p, so that the sampler,
    not the model runner, samples them)."""

    def _sample_one(self, logits, gumbel, params):
        if params.seed == POISON_SEED:
            raise ValueError("the logits contain NaN")
        return Sampler._sample_one(logits, gumbel, params)


def test_requests_that_fail_on_their_own_get_a_clear_status_and_the_node_goes_on(prefill):
    async def scenario(stub, node: PrefillNode, sink: TensorInbox) -> None:
        healthy_sampler, node.engine.sampler = node.engine.sampler, PoisonedSampler()
        poisoned = SamplingParams(max_tokens=4, temperature=1.0, top_p=0.9, seed=POISON_SEED)
        try:
            with pytest.raises(grpc.aio.AioRpcError) as sampling:
                await stub.Prefill(_request("nan", sink, _prompt(4, 64), poisoned), timeout=60)
        finally:
            node.engine.sampler = healthy_sampler
        assert sampling.value.code() == grpc.StatusCode.INTERNAL and "sampling failed for this request" in sampling.value.details()
        assert node_error_of(sampling.value).kind is ErrorKind.REQUEST_FAILED
        vocab_size = node.engine.runner.checkpoint.text.vocab_size
        with pytest.raises(grpc.aio.AioRpcError) as vocab:
            await stub.Prefill(_request("vocab", sink, [*_prompt(5, 8), vocab_size + 5]), timeout=60)
        assert vocab.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"token id {vocab_size + 5} is outside the vocabulary of {vocab_size}" in vocab.value.details()
        assert await _engine_requests(node) == []
        reply = await stub.Prefill(_request("healthy", sink, _prompt(6, 64)), timeout=60)
        assert reply.first_token_id >= 0

    _run(prefill, scenario)


async def _has(node: PrefillNode, request_id: str) -> bool:
    return request_id in await _engine_requests(node)


async def _is_idle(node: PrefillNode) -> bool:
    def idle(engine) -> bool:
        return not engine.requests and not engine.scheduler.running and not engine.scheduler.waiting

    return await asyncio.wrap_future(node.loop.call(idle))


class DeadlineRecordingEncoder(rpc.EncodeServicer):
    """Stands in for an encoder: notes what is left of each call's deadline, and has no pixels."""

    def __init__(self) -> None:
        self.time_remaining: list[float | None] = []

    async def Encode(self, request: pb.EncodeRequest, context) -> pb.EncodeResponse:
        self.time_remaining.append(context.time_remaining())
        return pb.EncodeResponse(missing_pixels=[item.mm_hash for item in request.items])


def test_an_item_larger_than_the_embedding_cache_is_refused_with_the_reason(prefill):
    """A request's items are resident a window at a time, so a clip of any length fits; one item
    past the embedding cache's rows never can, and is refused as invalid (never retried),
    naming the setting."""

    async def scenario(stub, node: PrefillNode, sink: TensorInbox) -> None:
        rows = node.engine.encoder_cache.cache_size + 1
        tokens = [10] * 8 + [151656] * rows + [11] * 8
        request = _request("too-many-rows", sink, tokens)
        item = request.mm_items.add(mm_hash="group-0", offset=8, length=rows, grid_thw=[1, 2, 2 * rows])
        item.placement.CopyFrom(pb.GroupPlacement(index=0, time_position=0))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Prefill(request, timeout=60)
        assert node_error_of(refused.value).kind is ErrorKind.INVALID_REQUEST
        assert f"needs {rows} embedding rows" in refused.value.details() and "encoder_cache_tokens" in refused.value.details()
        reply = await stub.Prefill(_request("fine-after", sink, _prompt(7, 64)), timeout=60)
        assert reply.first_token_id >= 0

    _run(prefill, scenario)


def test_the_encoder_call_gets_what_is_left_of_the_prefill_calls_deadline(prefill):
    encoder = DeadlineRecordingEncoder()

    async def scenario(stub, node: PrefillNode, sink: TensorInbox) -> None:
        server = grpc.aio.server()
        rpc.add_EncodeServicer_to_server(encoder, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            request = _request("with-image", sink, _prompt(4, 64))
            request.mm_items.append(pb.MmItem(mm_hash="ab" * 32, offset=4, length=16, grid_thw=[1, 8, 8]))
            request.encoder_address = f"127.0.0.1:{port}"
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await stub.Prefill(request, timeout=7.0)
            assert node_error_of(failed.value).kind is ErrorKind.MISSING_PIXELS
        finally:
            await server.stop(0)

    _run(prefill, scenario)
    # Not a fixed timeout of its own (it was 120 s): an encode nobody waits for is not run. (gRPC
    # rounds a deadline on the wire, so what is left may read a few ms over the 7 s.)
    assert len(encoder.time_remaining) == 1 and 5.0 < encoder.time_remaining[0] < 8.0
