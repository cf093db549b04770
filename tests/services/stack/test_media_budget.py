"""The pre-admission media budget through a stack of its own, with the official openai
client: a request whose images alone exceed the whole budget is a 413 before any node sees it,
and a burst of large-image requests past the budget gets 429s while a small-image request beside
them is answered."""

from __future__ import annotations

import asyncio
import os

import pytest
from openai import APIStatusError, AsyncOpenAI

from tests.factories import image_data_url, make_image
from tests.services.stack.conftest import launch_stack, stop_stack
from tests.services.stack.e2e_helpers import client_for

# Priced by Qwen2-VL's resize rule: 448x448 is 256 vision tokens, 56x56 is 4.
BUDGET = 600
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
    assert info.value.status_code == 413 and f"at most {BUDGET}" in info.value.message
    after = budget_stack.metrics()
    assert after.get("tessera_preprocess_requests_total", 0.0) == before.get("tessera_preprocess_requests_total", 0.0)
    assert after.get("tessera_media_too_large_total", 0.0) == before.get("tessera_media_too_large_total", 0.0) + 1


def test_a_burst_past_the_budget_gets_429s_while_a_small_request_is_answered(budget_stack):
    client = AsyncOpenAI(base_url=budget_stack.base_url, api_key="unused", max_retries=0, timeout=120)

    async def ask(url: str) -> int:
        try:
            await client.chat.completions.create(
                model="tiny", messages=_messages(url), max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
            )
            return 200
        except APIStatusError as exc:
            return exc.status_code

    async def burst() -> tuple[list[int], int]:
        large = [asyncio.create_task(ask(LARGE)) for _ in range(8)]  # 8 x 256 tokens into a budget of 600
        await asyncio.sleep(0)
        small = await ask(SMALL)
        return list(await asyncio.gather(*large)), small

    statuses, small = asyncio.run(burst())
    assert small == 200
    assert statuses.count(429) >= 1 and statuses.count(200) >= 2 and set(statuses) <= {200, 429}, statuses
    assert budget_stack.metrics().get("tessera_media_cost_inflight", 0.0) == 0


def test_a_clip_over_the_whole_budget_is_a_413_from_its_header_and_the_tower_rate_is_reported(budget_stack):
    """An MP4 clip's price comes from its header (frames, rate, size): 8 s at 2 frames per second
    of 448x448 frames is 8 groups of 256 tokens, over the budget of 600."""
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
