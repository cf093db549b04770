"""The Decode servicer over a real decode node, fed KV pages by a real prefill node: a stream that
goes away (cancelled, or past its deadline) aborts its request and frees its KV pages, one that
goes away while its pages are still on the way is never adopted, and a node out of KV pages
refuses a new stream as busy (the gateway then tries another decode node, or answers 429)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import pytest

from protos.gen import pb, rpc
from services.decode.node import DecodeNode
from services.decode.server import DecodeServicer
from services.engine.config import EngineConfig
from services.engine.sampling_params import SamplingParams
from services.engine.sampling_wire import sampling_to_pb
from services.prefill.job import PrefillJob
from services.prefill.node import PrefillNode
from services.transport.node_admission import NodeAdmission
from services.transport.node_error import ErrorKind, NodeError, NodeRef, node_error_of
from tests.aio_server import serving
from tests.services.prefill.fakes import FakeUpstream

# 64 blocks of 16 tokens: one long stream (40 blocks reserved: prompt + max_tokens) leaves too few
# for a second one.
NUM_KV_BLOCKS = 64
MAX_TOKENS = 600


@pytest.fixture(scope="module")
def nodes(tiny_model):
    prefill = PrefillNode(tiny_model, EngineConfig(), data_bind="tcp://127.0.0.1:0")
    decode = DecodeNode(tiny_model, EngineConfig(num_kv_blocks=NUM_KV_BLOCKS), data_bind="tcp://127.0.0.1:0")
    yield prefill, decode
    decode.close()
    prefill.close()


def _prompt(seed: int) -> list[int]:
    return [10 + (i * 7 + seed * 131) % 1000 for i in range(24)]


def _sampling() -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)


async def _prefill(prefill: PrefillNode, decode: DecodeNode, request_id: str, seed: int) -> int:
    """Prefill the prompt and ship its KV pages to the decode node; its first token."""
    job = PrefillJob(request_id, _prompt(seed), [], _sampling(), decode.data_address)
    return (await prefill.run(job, FakeUpstream())).first_token_id  # text only: no upstream call


def _decode_request(request_id: str, seed: int, first_token: int) -> pb.DecodeRequest:
    return pb.DecodeRequest(
        request_id=request_id, prompt_token_ids=_prompt(seed), first_token_id=first_token, sampling=sampling_to_pb(_sampling()), stream=True
    )


async def _until(condition: Callable[[], object], timeout_s: float = 60.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not await condition():
            await asyncio.sleep(0.02)


async def _idle_with_free_pages(decode: DecodeNode) -> bool:
    def idle(engine) -> bool:
        return not engine.requests and engine.kv.pool.num_free_blocks == NUM_KV_BLOCKS

    return await asyncio.wrap_future(decode.loop.call(idle))


def _run(nodes, scenario) -> None:
    prefill, decode = nodes
    admission = NodeAdmission("decode")
    servicer = DecodeServicer(decode, admission)

    async def main() -> None:
        async with serving(lambda server: rpc.add_DecodeServicer_to_server(servicer, server)) as channel:
            await scenario(rpc.DecodeStub(channel), prefill, decode, admission)
        assert admission.num_pending == 0

    asyncio.run(main())


def test_a_stream_cancelled_before_its_pages_arrive_is_never_adopted(nodes):
    async def scenario(stub, prefill: PrefillNode, decode: DecodeNode, admission: NodeAdmission) -> None:
        adopted = decode.metrics.num_requests.value
        # The gateway calls Decode once prefill has shipped; here the pages are not sent yet.
        stream = stub.Decode(_decode_request("early", 1, first_token=0))
        await _until(lambda: _true(admission.num_pending == 1))
        stream.cancel()
        await _until(lambda: _true(admission.num_pending == 0))
        await _prefill(prefill, decode, "early", 1)  # the pages arrive after the stream left
        await asyncio.sleep(1.0)  # adopted, it would now be decoding 600 tokens
        assert await _idle_with_free_pages(decode)
        assert decode.metrics.num_requests.value == adopted

    _run(nodes, scenario)


def test_a_stream_past_its_deadline_mid_decode_is_aborted_and_frees_its_pages(nodes):
    async def scenario(stub, prefill: PrefillNode, decode: DecodeNode, admission: NodeAdmission) -> None:
        aborted = decode.metrics.engine.num_requests_aborted.value
        first = await _prefill(prefill, decode, "expired", 2)
        chunks = []
        with pytest.raises(grpc.aio.AioRpcError) as expired:
            async for chunk in stub.Decode(_decode_request("expired", 2, first), timeout=1.5):
                chunks.append(chunk)
        assert expired.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert 0 < sum(len(c.token_ids) for c in chunks) < MAX_TOKENS
        await _until(lambda: _idle_with_free_pages(decode))
        assert decode.metrics.engine.num_requests_aborted.value == aborted + 1

    _run(nodes, scenario)


def test_a_node_out_of_kv_pages_refuses_a_stream_as_busy_and_a_cancelled_stream_frees_them(nodes):
    async def scenario(stub, prefill: PrefillNode, decode: DecodeNode, admission: NodeAdmission) -> None:
        aborted = decode.metrics.engine.num_requests_aborted.value
        holder = stub.Decode(_decode_request("holder", 3, await _prefill(prefill, decode, "holder", 3)))
        await holder.read()  # its first token, sent before adoption
        await holder.read()  # the engine's first: adopted, its pages for prompt + max_tokens are reserved
        received = []
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for chunk in stub.Decode(_decode_request("refused", 4, await _prefill(prefill, decode, "refused", 4)), timeout=30):
                received.append(chunk)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert received == []  # refused before its first token went out
        assert node_error_of(refused.value) == NodeError(ErrorKind.OVERLOADED, refused.value.details(), NodeRef("decode"))
        assert "no free KV pages" in refused.value.details()
        holder.cancel()  # the client went away mid-stream
        await _until(lambda: _idle_with_free_pages(decode))
        assert decode.metrics.engine.num_requests_aborted.value == aborted + 1

    _run(nodes, scenario)


async def _true(value: bool) -> bool:
    return value


def test_a_stream_awaits_its_pages_on_the_loop_holding_no_thread(nodes, monkeypatch):
    """The pages come through the inbox's awaitable ``arrival``: a thread blocked on the inbox
    (``wait``) or a worker thread (``asyncio.to_thread``) on the decode path fails this test."""

    def no_thread(*args, **kwargs):
        raise AssertionError("a thread waited on the decode node's inbox")

    to_thread = asyncio.to_thread

    def no_decode_thread(fn, /, *args, **kwargs):  # the prefill node in this process may use one
        if getattr(fn, "__self__", None) is not None and type(fn.__self__).__module__.startswith("services.decode"):
            no_thread()
        return to_thread(fn, *args, **kwargs)

    async def scenario(stub, prefill: PrefillNode, decode: DecodeNode, admission: NodeAdmission) -> None:
        monkeypatch.setattr(decode.inbox, "wait", no_thread)
        monkeypatch.setattr(asyncio, "to_thread", no_decode_thread)
        stream = stub.Decode(_decode_request("awaited", 5, first_token=0))  # called before its pages exist
        await _until(lambda: _true(admission.num_pending == 1))
        await _prefill(prefill, decode, "awaited", 5)
        chunks = [chunk async for chunk in stream]
        assert sum(len(c.token_ids) for c in chunks) == MAX_TOKENS and chunks[-1].finished
        await _until(lambda: _idle_with_free_pages(decode))

    _run(nodes, scenario)
