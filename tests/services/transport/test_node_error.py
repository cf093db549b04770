"""A node's typed error: the Python kinds are the proto's, and an error a servicer fails a call
with arrives at a real grpc.aio client whole, with the gRPC code other clients read."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from protos.gen import pb, rpc
from services.transport.node_error import GRPC_CODE, NODE_ERROR_KEY, ErrorKind, NodeError, NodeRef, abort_with, node_error_of
from shared.types import MmHash
from tests.aio_server import serving
from tests.fake_rpc_error import FakeRpcError


def test_the_python_kinds_are_the_protos_and_each_has_a_grpc_code():
    assert [k.name for k in ErrorKind] == [n for n in pb.NodeError.Kind.keys() if n != "KIND_UNSPECIFIED"]
    assert set(GRPC_CODE) == set(ErrorKind)


def test_a_kind_this_side_does_not_know_is_no_typed_error():
    for kind in (pb.NodeError.KIND_UNSPECIFIED, 99):  # 99: a newer node's kind
        trailer = ((NODE_ERROR_KEY, pb.NodeError(kind=kind).SerializeToString()),)
        assert node_error_of(FakeRpcError(grpc.StatusCode.INTERNAL, "?", trailer)) is None
    assert node_error_of(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "gone")) is None


ERRORS = {
    "invalid": NodeError(ErrorKind.INVALID_REQUEST, "invalid_request: messages must be a list"),
    "busy": NodeError(ErrorKind.OVERLOADED, "the encoder node is at its limit", NodeRef("encoder")),
    "failed": NodeError(ErrorKind.NODE_FAILED, "encoder e:1 unavailable", NodeRef("encoder", "10.0.0.7:50051")),
    "missing": NodeError(ErrorKind.MISSING_PIXELS, "pixels never arrived", missing_mm_hashes=(MmHash("a1"), MmHash("b2"))),
}


class _Failing(rpc.EncodeServicer):
    async def Encode(self, request: pb.EncodeRequest, context) -> pb.EncodeResponse:
        await abort_with(context, ERRORS[request.target_data_address])


class _FailingStream(rpc.DecodeServicer):
    async def Decode(self, request: pb.DecodeRequest, context):
        yield pb.DecodeChunk(token_ids=[1])
        await abort_with(context, ERRORS[request.request_id])


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_an_error_round_trips_through_a_unary_call(name):
    async def scenario() -> None:
        async with serving(lambda server: rpc.add_EncodeServicer_to_server(_Failing(), server)) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await rpc.EncodeStub(channel).Encode(pb.EncodeRequest(target_data_address=name), timeout=5)
        error = ERRORS[name]
        assert failed.value.code() == GRPC_CODE[error.kind] and failed.value.details() == error.message
        assert node_error_of(failed.value) == error

    asyncio.run(scenario())


def test_an_error_round_trips_through_a_stream_after_its_first_chunk():
    async def scenario() -> None:
        async with serving(lambda server: rpc.add_DecodeServicer_to_server(_FailingStream(), server)) as channel:
            received = []
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                async for chunk in rpc.DecodeStub(channel).Decode(pb.DecodeRequest(request_id="busy"), timeout=5):
                    received.append(list(chunk.token_ids))
        assert received == [[1]] and failed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert node_error_of(failed.value) == ERRORS["busy"]

    asyncio.run(scenario())
