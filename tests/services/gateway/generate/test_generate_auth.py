"""The public Generate gRPC API with API keys: calls without a valid key fail UNAUTHENTICATED,
health checks stay open, and the caller's tenant decides the request's cache salt."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos.gen import pb, rpc
from services.gateway.frontend.tenants import ApiKeys, Tenant
from services.gateway.generate.server import GenerateServicer, start_generate_server
from services.stack.node_process import free_port
from tests.services.gateway.http.test_app import FakePipeline, frontend_for

REQUEST = pb.GenerateRequest(request_json=json.dumps({"messages": [{"role": "user", "content": "hi"}]}))


async def _generate(stub: rpc.GenerateStub, metadata: tuple = ()) -> list[pb.GenerateChunk]:
    return [chunk async for chunk in stub.Generate(REQUEST, metadata=metadata, timeout=10)]


def test_generate_needs_a_key_and_passes_the_tenant_on():
    pipeline = FakePipeline()
    address = f"127.0.0.1:{free_port()}"

    async def scenario() -> None:
        servicer = GenerateServicer(frontend_for(pipeline, default_max_tokens=4))
        server = await start_generate_server(servicer, address, api_keys=ApiKeys({"sk-a": Tenant("acme")}))
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                stub = rpc.GenerateStub(channel)
                for metadata in ((), (("authorization", "Bearer sk-wrong"),)):
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await _generate(stub, metadata)
                    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
                chunks = await _generate(stub, (("authorization", "Bearer sk-a"),))
                assert "".join(c.text_delta for c in chunks) == "Hello there friend"
                assert pipeline.calls[-1][2] == "tenant:acme|"
                health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
                assert health.status == health_pb2.HealthCheckResponse.SERVING
        finally:
            await server.stop(grace=None)

    asyncio.run(scenario())
