"""The typed public Generate: a protobuf prompt, sampling and n, over a real grpc.aio server in
front of a fake pipeline; and the conversion rules (pure)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from protos.gen import pb, rpc
from services.gateway.errors import GatewayError
from services.gateway.frontend.tenants import Tenant
from services.gateway.generate.server import GenerateServicer, start_generate_server
from services.gateway.generate.typed import typed_generations
from services.stack.node_process import free_port
from tests.services.gateway.http.test_app import FakePipeline, frontend_for


def chat_request(**kwargs) -> pb.GenerateRequest:
    prompt = pb.PromptInput(chat=pb.ChatPrompt(messages=[pb.ChatMessage(role=pb.ChatMessage.USER, text="hi")]))
    return pb.GenerateRequest(prompt=prompt, **kwargs)


def generate(pipeline: FakePipeline, request: pb.GenerateRequest) -> list[pb.GenerateChunk]:
    address = f"127.0.0.1:{free_port()}"

    async def call() -> list[pb.GenerateChunk]:
        server = await start_generate_server(GenerateServicer(frontend_for(pipeline, default_max_tokens=8)), address)
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                return [chunk async for chunk in rpc.GenerateStub(channel).Generate(request, timeout=10)]
        finally:
            await server.stop(grace=None)

    return asyncio.run(call())


def test_n_typed_choices_stream_tagged_with_their_index_and_the_request_id():
    pipeline = FakePipeline()
    chunks = generate(pipeline, chat_request(n=2, request_id="req-7", sampling=pb.SamplingParams(max_tokens=3, seed=5)))
    for index in (0, 1):
        mine = [c for c in chunks if c.index == index]
        assert "".join(c.text_delta for c in mine) == "Hello there friend"
        assert [list(c.token_ids) for c in mine] == [[100], [101], [102]]
        assert mine[-1].finished and mine[-1].finish_reason == "stop" and not mine[0].HasField("usage")
        assert (mine[-1].usage.prompt_tokens, mine[-1].usage.completion_tokens, mine[-1].usage.cached_tokens) == (7, 3, 2)
    assert {c.request_id for c in chunks} == {"req-7"}
    seeds = sorted(sampling.seed for _, sampling, _, _ in pipeline.calls)
    assert seeds == [5, 6]  # choice i samples with seed + i
    prompt = pipeline.calls[0][0]
    assert prompt.chat.messages[0].text == "hi"


@pytest.mark.parametrize(
    ("request_", "code", "text"),
    [
        (pb.GenerateRequest(), grpc.StatusCode.INVALID_ARGUMENT, "has no prompt"),
        (chat_request(sampling=pb.SamplingParams(temperature=-1)), grpc.StatusCode.INVALID_ARGUMENT, "temperature must be >= 0"),
        (chat_request(model="gpt-4"), grpc.StatusCode.NOT_FOUND, "does not exist"),
        (chat_request(n=99), grpc.StatusCode.INVALID_ARGUMENT, "n must be at most"),
        (pb.GenerateRequest(request_json="{nope"), grpc.StatusCode.INVALID_ARGUMENT, "not valid JSON"),
    ],
)
def test_bad_typed_requests_get_a_clear_status(request_, code, text):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        generate(FakePipeline(), request_)
    assert info.value.code() == code and text in info.value.details()


def test_a_defaulted_max_tokens_fits_the_context_and_a_tenant_scopes_salt_and_image_uuids():
    image = pb.ImageInput(url="data:image/png;base64,AAAA", uuid="cat")
    request = pb.GenerateRequest(prompt=pb.PromptInput(text="<image> what?", images=[image]), cache_salt="s")
    request_id, [generation] = typed_generations(request, served_names=("tiny",), default_max_tokens=64, tenant=Tenant("acme"))
    assert request_id.startswith("gen-") and generation.fit_max_tokens and generation.sampling.max_tokens == 64
    assert generation.cache_salt == "tenant:acme|s" and generation.prompt.images[0].uuid == "acme/cat"
    assert request.prompt.images[0].uuid == "cat"  # the caller's message is left as it was
    with pytest.raises(GatewayError):
        typed_generations(pb.GenerateRequest(prompt=request.prompt, n=17), served_names=("tiny",), default_max_tokens=64, tenant=None)


def test_a_tenant_scopes_every_video_uuid_too():
    video = pb.VideoInput(uuid="clip")
    chat = pb.ChatPrompt(
        messages=[pb.ChatMessage(role=pb.ChatMessage.Role.Value("USER"), parts=pb.ContentParts(parts=[pb.ContentPart(video=video)]))]
    )
    for prompt in (pb.PromptInput(text="<video>", videos=[video]), pb.PromptInput(chat=chat)):
        _, [generation] = typed_generations(
            pb.GenerateRequest(prompt=prompt), served_names=("tiny",), default_max_tokens=8, tenant=Tenant("acme")
        )
        scoped = generation.prompt.videos or [generation.prompt.chat.messages[0].parts.parts[0].video]
        assert [v.uuid for v in scoped] == ["acme/clip"]
