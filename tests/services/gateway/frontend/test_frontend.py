"""The same guards at every door: one gateway (create_app) over a fake pipeline, its HTTP API
and its gRPC Generate on the same Frontend. Each guard refuses a request at both doors with
matching statuses (Generate: the gRPC code and the HTTP status in a trailer), and nothing a
guard refuses reaches the pipeline."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from fastapi.testclient import TestClient

from protos.gen import pb, rpc
from services.gateway.generate.server import HTTP_STATUS_KEY, RETRY_AFTER_KEY, GenerateServicer, start_generate_server
from services.stack.node_process import free_port
from tests.factories import image_data_url, make_image
from tests.services.gateway.frontend.test_media_budget import CostingPipeline
from tests.services.gateway.http.test_app import MALFORMED_BODIES, gateway_for

GRPC_CODE = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}


class Doors:
    """One gateway's two doors."""

    def __init__(self, **settings) -> None:
        self.pipeline = CostingPipeline()
        app, self.frontend = gateway_for(self.pipeline, default_max_tokens=8, **settings)
        self.state = self.frontend.state
        self.http = TestClient(app)

    def post(self, image_url: str | None = None, **fields) -> tuple[int, dict, dict]:
        content = [{"type": "text", "text": "?"}] + ([{"type": "image_url", "image_url": {"url": image_url}}] if image_url else [])
        response = self.http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": content}], **fields})
        return response.status_code, response.json(), dict(response.headers)

    def generate(self, image_url: str | None = None, **request) -> grpc.aio.AioRpcError | list[pb.GenerateChunk]:
        parts = [pb.ContentPart(text="?")] + ([pb.ContentPart(image=pb.ImageInput(url=image_url))] if image_url else [])
        prompt = pb.PromptInput(chat=pb.ChatPrompt(messages=[pb.ChatMessage(role=pb.ChatMessage.USER, parts=pb.ContentParts(parts=parts))]))
        return self.call(pb.GenerateRequest(prompt=prompt, **request))

    def generate_json(self, body: str) -> grpc.aio.AioRpcError | list[pb.GenerateChunk]:
        return self.call(pb.GenerateRequest(request_json=body))

    def embed(self, request: pb.EmbedRequest) -> grpc.aio.AioRpcError | pb.EmbedResponse:
        return self.call(request, method="Embed")

    def call(self, request, method: str = "Generate") -> grpc.aio.AioRpcError | list[pb.GenerateChunk] | pb.EmbedResponse:
        address = f"127.0.0.1:{free_port()}"

        async def call():
            server = await start_generate_server(GenerateServicer(self.frontend), address)
            try:
                async with grpc.aio.insecure_channel(address) as channel:
                    stub = rpc.GenerateStub(channel)
                    if method == "Embed":
                        return await stub.Embed(request, timeout=10)
                    return [c async for c in stub.Generate(request, timeout=10)]
            except grpc.aio.AioRpcError as error:
                return error
            finally:
                await server.stop(grace=None)

        return asyncio.run(call())


def assert_same_refusal(doors: Doors, http: tuple[int, dict, dict], grpc_error, status: int, text: str) -> None:
    assert http[0] == status and text in http[1]["error"]["message"], http
    assert isinstance(grpc_error, grpc.aio.AioRpcError), grpc_error
    trailer = dict(grpc_error.trailing_metadata() or ())
    assert (grpc_error.code(), trailer.get(HTTP_STATUS_KEY)) == (GRPC_CODE[status], str(status)) and text in grpc_error.details()
    if status == 429:
        assert trailer.get(RETRY_AFTER_KEY) == http[2]["retry-after"]
    assert doors.pipeline.calls == []


def test_media_over_the_whole_budget_is_refused_at_both_doors_before_any_work():
    doors = Doors(max_media_tokens_per_encoder=500)
    huge = image_data_url(make_image(1200, 900, seed=4))
    assert_same_refusal(doors, doors.post(huge), doors.generate(huge), 413, "vision tokens")


def test_media_while_the_budget_is_full_is_refused_at_both_doors_with_a_retry_hint():
    doors = Doors(max_media_tokens_per_encoder=1000)
    held = doors.state.media.take(700)  # large requests in flight: the rest is the small requests' reserve
    image = image_data_url(make_image(280, 280, seed=3))  # 100 tokens: a large request here
    assert_same_refusal(doors, doors.post(image), doors.generate(image), 429, "vision tokens in flight")
    held.release()
    assert doors.post(image)[0] == 200 and len(doors.generate(image)) == 3
    assert doors.state.media.num_in_flight == 0  # each door handed its share back


def test_logprobs_over_the_gateway_s_cap_are_refused_at_both_doors():
    doors = Doors(max_logprobs=5)
    http = doors.post(logprobs=True, top_logprobs=10)
    grpc_error = doors.generate(sampling=pb.SamplingParams(max_tokens=2, logprobs=10))
    assert_same_refusal(doors, http, grpc_error, 400, "greater than max allowed: 5")
    prompt_error = doors.generate(sampling=pb.SamplingParams(max_tokens=2, prompt_logprobs=6))
    assert_same_refusal(doors, doors.post(prompt_logprobs=6), prompt_error, 400, "greater than max allowed: 5")
    assert len(doors.generate(sampling=pb.SamplingParams(max_tokens=2, logprobs=5))) == 3


def test_choices_over_the_admission_limit_are_refused_at_both_doors():
    doors = Doors(max_num_requests=1)
    assert_same_refusal(doors, doors.post(n=2), doors.generate(n=2), 429, "limit of 1 requests in flight")


def test_a_draining_gateway_refuses_new_requests_at_both_doors():
    doors = Doors()
    doors.state.draining = True
    assert_same_refusal(doors, doors.post(), doors.generate(), 503, "draining")


@pytest.mark.parametrize("door", ["http", "generate"])
def test_a_generate_request_counts_in_flight_as_an_http_one(door):
    doors = Doors()
    seen = []
    original = doors.pipeline.run

    async def run(*args, **kwargs):
        seen.append(doors.state.num_in_flight)
        async for event in original(*args, **kwargs):
            yield event

    doors.pipeline.run = run
    doors.post() if door == "http" else doors.generate()
    assert seen == [1] and doors.state.num_in_flight == 0


@pytest.mark.parametrize("raw,param,text", MALFORMED_BODIES)
def test_every_malformed_chat_body_gets_a_400_through_generate_s_json_form_as_over_http(raw, param, text):
    doors = Doors()
    http = doors.http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    error = doors.generate_json(raw.decode())
    assert isinstance(error, grpc.aio.AioRpcError), error
    assert (http.status_code, error.code(), dict(error.trailing_metadata())[HTTP_STATUS_KEY]) == (400, GRPC_CODE[400], "400")
    assert text in error.details() and doors.pipeline.calls == []


def test_embeddings_meet_the_same_media_budget_and_drain_at_both_doors_before_any_work():
    doors = Doors(max_media_tokens_per_encoder=500, runner="both")
    huge = image_data_url(make_image(1200, 900, seed=4))
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": huge}}]}]
    response = doors.http.post("/v1/embeddings", json={"messages": messages})
    parts = pb.ContentParts(parts=[pb.ContentPart(image=pb.ImageInput(url=huge))])
    prompt = pb.PromptInput(chat=pb.ChatPrompt(messages=[pb.ChatMessage(role=pb.ChatMessage.USER, parts=parts)]))
    http = (response.status_code, response.json(), dict(response.headers))
    assert_same_refusal(doors, http, doors.embed(pb.EmbedRequest(prompt=prompt)), 413, "vision tokens")
    doors.state.draining = True
    response = doors.http.post("/v1/embeddings", json={"input": "hello"})
    http = (response.status_code, response.json(), dict(response.headers))
    assert_same_refusal(doors, http, doors.embed(pb.EmbedRequest(prompt=pb.PromptInput(text="hello"))), 503, "draining")
