"""The Encode servicer over a stand-in node: calls that arrive while a batch runs make up the next
batch, a call that goes away while waiting (cancelled, or past its deadline) is never encoded,
and an encode that fails fails its own call only, as the request's error (REQUEST_FAILED: a 500,
never retried elsewhere)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

import grpc
import pytest

from protos.gen import pb, rpc
from services.encoder.batching import BatchMetrics
from services.encoder.node import EncodeItem, EncodeResult
from services.encoder.server import EncodeServicer
from services.engine.lora.node_adapters import NodeAdapters
from services.transport.node_admission import NodeAdmission
from services.transport.node_error import ErrorKind, node_error_of
from shared.node_metrics import snapshot
from tests.aio_server import serving


@dataclass(slots=True)
class StandInMetrics:
    batching: BatchMetrics = field(default_factory=BatchMetrics)


class StandInNode:
    """Encodes by name: "slow" waits for ``release``, "poison" raises like a shape mismatch."""

    data_address = "tcp://127.0.0.1:9"

    def __init__(self) -> None:
        self.adapters = NodeAdapters(None)  # it serves no LoRA adapters
        self.metrics = StandInMetrics()
        self.release = threading.Event()
        self.encoded: list[str] = []
        self.batches: list[list[str]] = []

    async def encode_batch(self, calls: list[tuple[list[EncodeItem], str]]) -> list[EncodeResult | Exception]:
        return await asyncio.to_thread(self._encode_batch, calls)  # "slow" blocks, as a tower pass does

    def _encode_batch(self, calls: list[tuple[list[EncodeItem], str]]) -> list[EncodeResult | Exception]:
        self.batches.append([items[0].mm_hash for items, _ in calls])
        results: list[EncodeResult | Exception] = []
        for items, target in calls:
            try:
                results.append(self.encode(items, target))
            except Exception as exc:
                results.append(exc)
        return results

    def encode(self, items: list[EncodeItem], target_address: str) -> EncodeResult:
        name = items[0].mm_hash
        self.encoded.append(name)
        if name == "poison":
            raise RuntimeError("shape '[4, 1280]' is invalid for input of size 1000")
        if name == "slow":
            self.release.wait(10)
        return EncodeResult([], len(items), 0)


def _request(name: str) -> pb.EncodeRequest:
    return pb.EncodeRequest(items=[pb.MmItem(mm_hash=name, length=4, grid_thw=[1, 4, 4])], target_data_address="tcp://127.0.0.1:9")


def test_calls_that_go_away_while_waiting_their_turn_are_never_encoded():
    async def scenario() -> None:
        node, admission = StandInNode(), NodeAdmission("encoder")
        servicer = EncodeServicer(node, admission)  # type: ignore[arg-type]
        async with serving(lambda server: rpc.add_EncodeServicer_to_server(servicer, server)) as channel:
            stub = rpc.EncodeStub(channel)
            running = asyncio.ensure_future(stub.Encode(_request("slow")))
            while node.encoded != ["slow"]:
                await asyncio.sleep(0.01)
            cancelled = asyncio.ensure_future(stub.Encode(_request("cancelled")))
            expiring = stub.Encode(_request("expired"), timeout=0.3)
            while admission.num_pending < 3:
                await asyncio.sleep(0.01)
            cancelled.cancel()
            with pytest.raises(grpc.aio.AioRpcError) as expired:
                await expiring
            assert expired.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            node.release.set()
            assert (await running).num_encoded == 1
            assert (await stub.Encode(_request("next"), timeout=5)).num_encoded == 1
            assert node.encoded == ["slow", "next"] and admission.num_pending == 0

    asyncio.run(scenario())


def test_calls_arriving_while_a_batch_runs_make_up_the_next_batch():
    async def scenario() -> None:
        node = StandInNode()
        servicer = EncodeServicer(node, NodeAdmission("encoder"))  # type: ignore[arg-type]
        async with serving(lambda server: rpc.add_EncodeServicer_to_server(servicer, server)) as channel:
            stub = rpc.EncodeStub(channel)
            running = asyncio.ensure_future(stub.Encode(_request("slow")))
            while node.encoded != ["slow"]:
                await asyncio.sleep(0.01)
            waiting = [asyncio.ensure_future(stub.Encode(_request(name), timeout=10)) for name in ("a", "poison", "b")]
            while len(servicer.batcher._line) < 3:
                await asyncio.sleep(0.01)
            node.release.set()
            await running
            outcomes = await asyncio.gather(*waiting, return_exceptions=True)
            assert [o.num_encoded for o in (outcomes[0], outcomes[2])] == [1, 1]
            assert isinstance(outcomes[1], grpc.aio.AioRpcError) and outcomes[1].code() == grpc.StatusCode.INTERNAL
            assert node.batches == [["slow"], ["a", "poison", "b"]]
            assert snapshot(node.metrics).counters == {"encoder_batches_total": 2.0, "encoder_calls_batched_total": 4.0}

    asyncio.run(scenario())


def test_a_failing_encode_fails_its_own_call_as_the_requests_error_and_the_next_call_is_served():
    async def scenario() -> None:
        node = StandInNode()
        servicer = EncodeServicer(node, NodeAdmission("encoder"))  # type: ignore[arg-type]
        async with serving(lambda server: rpc.add_EncodeServicer_to_server(servicer, server)) as channel:
            stub = rpc.EncodeStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await stub.Encode(_request("poison"), timeout=5)
            assert failed.value.code() == grpc.StatusCode.INTERNAL
            assert node_error_of(failed.value).kind is ErrorKind.REQUEST_FAILED
            assert "encoding failed for this request: shape" in failed.value.details()
            assert (await stub.Encode(_request("healthy"), timeout=5)).num_encoded == 1

    asyncio.run(scenario())
