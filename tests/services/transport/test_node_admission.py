"""A node's admission: at most max_pending_requests calls queued or running; past that, a busy
refusal (RESOURCE_EXHAUSTED, an OVERLOADED node error) at once, and the place is given back when
a call ends however it ends."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from protos.gen import pb, rpc
from services.transport.node_admission import NodeAdmission
from services.transport.node_error import ErrorKind, NodeError, NodeRef, node_error_of
from shared.node_metrics import snapshot
from tests.aio_server import serving


def test_admits_up_to_the_limit_then_refuses_and_counts():
    admission = NodeAdmission("decode", max_pending_requests=2)
    assert admission.try_admit() and admission.try_admit()
    assert not admission.try_admit()
    admission.release()
    assert admission.try_admit()
    assert snapshot(admission.metrics).gauges == {"node_requests_pending": 2.0}
    assert snapshot(admission.metrics).counters == {"node_requests_refused_total": 1.0}
    with pytest.raises(ValueError):
        NodeAdmission("decode", max_pending_requests=0)


class _Gated(rpc.EncodeServicer):
    """Holds every admitted call until ``release`` is set; some calls fail on their own."""

    def __init__(self, admission: NodeAdmission) -> None:
        self.admission = admission
        self.release = asyncio.Event()
        self.refused: list[str] = []

    async def Encode(self, request: pb.EncodeRequest, context) -> pb.EncodeResponse:
        name = request.target_data_address
        async with self.admission.admitted(context, on_refused=lambda: self.refused.append(name)):
            if name == "fails":
                raise RuntimeError("this call's own failure")
            await self.release.wait()
        return pb.EncodeResponse(num_encoded=1)


def test_a_full_node_refuses_at_once_as_busy_and_frees_places_when_calls_end():
    async def scenario() -> None:
        admission = NodeAdmission("encoder", max_pending_requests=2)
        servicer = _Gated(admission)
        async with serving(lambda server: rpc.add_EncodeServicer_to_server(servicer, server)) as channel:
            stub = rpc.EncodeStub(channel)
            held = [asyncio.ensure_future(stub.Encode(pb.EncodeRequest(target_data_address=f"held{i}"))) for i in range(2)]
            while admission.num_pending < 2:
                await asyncio.sleep(0.01)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Encode(pb.EncodeRequest(target_data_address="third"), timeout=5)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert node_error_of(refused.value) == NodeError(ErrorKind.OVERLOADED, refused.value.details(), NodeRef("encoder"))
            assert "at its limit of 2 requests" in refused.value.details() and servicer.refused == ["third"]
            held[0].cancel()  # a cancelled call gives its place back
            while admission.num_pending > 1:
                await asyncio.sleep(0.01)
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await stub.Encode(pb.EncodeRequest(target_data_address="fails"), timeout=5)
            assert failed.value.code() == grpc.StatusCode.UNKNOWN and admission.num_pending == 1  # so does a failed one
            servicer.release.set()
            assert (await held[1]).num_encoded == 1
            assert admission.num_pending == 0 and admission.metrics.num_refused.value == 1

    asyncio.run(scenario())
