"""The pre-admission media budget through a stack of its own, with the official openai
client: a request whose images alone exceed what one request may hold is a 413 before any node
sees it, and while a burst of large-image requests fills the budget (429s past it) every
small-image request beside them is answered: the budget keeps a reserve large ones never take."""

from __future__ import annotations

import asyncio
import os

import pytest
from openai import APIStatusError, AsyncOpenAI

from tests.factories import image_data_url, make_image
from tests.services.stack.conftest import launch_stack, stop_stack
from tests.services.stack.e2e_helpers import client_for

# Priced by Qwen2-VL's resize rule: 448x448 is 256 vision tokens, 56x56 is 4. A quarter of the
# budget (128) is kept for small requests (at most 32 tokens each): one large request at a time.
BUDGET = 512  # two large requests would fill it: the reserve is what lets small ones through
LARGE_LIMIT = BUDGET - BUDGET // 4
LARGE = image_data_url(make_image(448, 448, seed=41))
SMALL = image_data_url(make_image(56, 56, seed=42))


@pytest.fixture(scope="module")
def budget_stack(tmp_path_factory, repo_root):
    env = {**os.environ, "TESSERA_SERVE_MAX_MEDIA_TOKENS_PER_ENCODER": str(BUDGET)}
    running = launch_stack(tmp_path_factory.mktemp("media-budget"), repo_root, env=env)
    yield running
    stop_stack(running)


def _messages(*urls: str) -> list[dict]:
    return [{"role": "user", "content": [*({"type": "image_url", "image_url": {"url": u}} for u in urls), {"type": "text", "text": "?"}]}]


def test_a_request_over_the_whole_budget_is_a_413_before_any_node_sees_it(budget_stack):
    before = budget_stack.metrics()
    with pytest.raises(APIStatusError) as info:
        client_for(budget_stack).chat.completions.create(model="tiny", messages=_messages(LARGE, LARGE, LARGE), max_tokens=4)
    assert info.value.status_code == 413 and f"at most {LARGE_LIMIT} for one request" in info.value.message
    after = budget_stack.metrics()
    assert after.get("tessera_preprocess_requests_total", 0.0) == before.get("tessera_preprocess_requests_total", 0.0)
    assert after.get("tessera_media_too_large_total", 0.0) == before.get("tessera_media_too_large_total", 0.0) + 1


def test_while_large_requests_keep_the_budget_full_every_small_request_is_answered(tmp_path, repo_root):
    """The issue's stack: clients send 1344x1344 images (2304 tokens each) back to back into a
    budget of two of them, and small images arrive every 0.4 s. Without the reserve most small
    requests got a 429; with it every one is answered, and the large ones take turns or get 429s."""
    env = {**os.environ, "TESSERA_SERVE_MAX_MEDIA_TOKENS_PER_ENCODER": "4608"}
    stack = launch_stack(tmp_path, repo_root, env=env)
    client = AsyncOpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=120)

    async def ask(url: str) -> int:
        try:
            await client.chat.completions.create(
                model="tiny", messages=_messages(url), max_tokens=2, temperature=0, extra_body={"ignore_eos": True}
            )
            return 200
        except APIStatusError as exc:
            return exc.status_code

    async def large_client(seed: int, until: float) -> list[int]:
        statuses = []
        for i in range(50):  # bounded; it stops at ``until``
            if asyncio.get_running_loop().time() >= until:
                break
            statuses.append(await ask(image_data_url(make_image(1344, 1344, seed=seed + i))))
            if statuses[-1] == 429:
                await asyncio.sleep(0.1)
        return statuses

    async def traffic() -> tuple[list[int], list[int]]:
        until = asyncio.get_running_loop().time() + 4.0
        large = [asyncio.create_task(large_client(1000 * (c + 1), until)) for c in range(4)]
        small = []
        for i in range(10):
            await asyncio.sleep(0.4)
            small.append(asyncio.create_task(ask(image_data_url(make_image(112, 112, seed=300 + i)))))
        return [s for statuses in await asyncio.gather(*large) for s in statuses], list(await asyncio.gather(*small))

    try:
        large, small = asyncio.run(traffic())
        assert small == [200] * 10, small
        assert large.count(200) >= 1 and set(large) <= {200, 429}, large
        assert stack.metrics().get("tessera_media_cost_inflight", 0.0) == 0
    finally:
        stop_stack(stack)


def test_a_clip_over_the_whole_budget_is_a_413_from_its_header_and_the_tower_rate_is_reported(budget_stack):
    """An MP4 clip's price comes from its header (frames, rate, size): 8 s at 2 frames per second
    of 448x448 frames is 8 groups of 256 tokens, over the budget of 512."""
    from tests.factories import data_url, make_clip

    clip = data_url(make_clip(16, 2, 448, 448), "video/mp4")
    messages = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": clip}}, {"type": "text", "text": "?"}]}]
    before = budget_stack.metrics()
    with pytest.raises(APIStatusError) as info:
        client_for(budget_stack).chat.completions.create(model="tiny", messages=messages, max_tokens=4)
    assert info.value.status_code == 413 and "about 2048 vision tokens" in info.value.message, info.value.message
    assert "s of vision tower at the encoders' measured rate" in info.value.message  # the encoders calibrated at start-up
    after = budget_stack.metrics()
    assert after.get("tessera_preprocess_requests_total", 0.0) == before.get("tessera_preprocess_requests_total", 0.0)


def test_through_generate_the_same_budget_and_logprobs_cap_refuse_with_grpc_codes(budget_stack):
    """gRPC Generate's door has the HTTP API's guards: over what one request may hold is
    RESOURCE_EXHAUSTED (HTTP's 413 in the trailer), logprobs past --max-logprobs (20) is
    INVALID_ARGUMENT, and neither reaches a node."""
    import grpc

    from protos.gen import pb, rpc
    from services.gateway.generate.server import HTTP_STATUS_KEY
    from tests.factories import encode_image

    def generate(request: pb.GenerateRequest) -> grpc.RpcError:
        with grpc.insecure_channel(budget_stack.generate_address) as channel, pytest.raises(grpc.RpcError) as info:
            list(rpc.GenerateStub(channel).Generate(request, timeout=60))
        return info.value

    images = [pb.ContentPart(image=pb.ImageInput(data=encode_image(make_image(448, 448, seed=60 + i)))) for i in range(3)]
    parts = pb.ContentParts(parts=[*images, pb.ContentPart(text="?")])
    prompt = pb.PromptInput(chat=pb.ChatPrompt(messages=[pb.ChatMessage(role=pb.ChatMessage.USER, parts=parts)]))
    before = budget_stack.metrics().get("tessera_preprocess_requests_total", 0.0)
    too_large = generate(pb.GenerateRequest(prompt=prompt, sampling=pb.SamplingParams(max_tokens=2)))
    assert too_large.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and f"at most {LARGE_LIMIT}" in too_large.details()
    assert dict(too_large.trailing_metadata())[HTTP_STATUS_KEY] == "413"
    text = pb.PromptInput(chat=pb.ChatPrompt(messages=[pb.ChatMessage(role=pb.ChatMessage.USER, text="hi")]))
    capped = generate(pb.GenerateRequest(prompt=text, sampling=pb.SamplingParams(max_tokens=2, logprobs=21)))
    assert capped.code() == grpc.StatusCode.INVALID_ARGUMENT and "greater than max allowed: 20" in capped.details()
    assert budget_stack.metrics().get("tessera_preprocess_requests_total", 0.0) == before
