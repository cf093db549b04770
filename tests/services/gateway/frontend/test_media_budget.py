"""The pre-admission media budget (services/gateway/frontend/media_budget.py): images priced from their
headers alone, a 429 past the budget while smaller requests pass, a 413 for a request over the
whole of it before anything runs, and the budget handed back at the first token. Hostile headers
(bombs, zero sides, lying or mutated MP4 boxes) are priced or given way, never raised on."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import random

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protos.gen import pb
from services.gateway.errors import GatewayError
from services.gateway.frontend.clip_header import clip_header
from services.gateway.frontend.media_budget import TOWER_RATE_TTL_S, MediaBudget, MediaTicket, bytes_size, image_size, media_tokens
from services.models.media_cost import ClipCost, MediaCosts, ResizeCost, media_costs_to_json
from tests.damaged_media import damaged_clips, damaged_images, lying_clip_headers, mp4_clip
from tests.factories import data_url, encode_image, image_data_url, make_clip, make_image
from tests.services.gateway.http.test_app import FakePipeline, client_for

COST = ResizeCost(patch_size=14, merge_size=2, min_pixels=3136, max_pixels=12845056)
CLIP_COST = ClipCost(14, 2, 2, fps=None, num_frames=None, min_frames=4, max_frames=768, min_pixels=3136, max_pixels=602112)
COSTS = MediaCosts(COST, CLIP_COST)


def chat_prompt(*urls: str) -> pb.PromptInput:
    parts = [pb.ContentPart(image=pb.ImageInput(url=url)) for url in urls]
    message = pb.ChatMessage(role=pb.ChatMessage.Role.Value("USER"), parts=pb.ContentParts(parts=parts))
    return pb.PromptInput(chat=pb.ChatPrompt(messages=[message]))


def test_an_inline_images_size_is_read_from_its_header():
    image = make_image(320, 200, seed=1)
    assert image_size(image_data_url(image)) == (320, 200)
    assert image_size(image_data_url(image, "JPEG")) == (320, 200)
    assert image_size(base64.b64encode(encode_image(image, "WEBP")).decode()) == (320, 200)  # bare base64
    for unknown in ("https://example.com/cat.png", "/media/cat.png", "data:image/png;base64,AAAA", "not base64 at all!"):
        assert image_size(unknown) is None


def test_a_prompts_images_are_priced_by_the_models_resize_rule():
    small, remote = image_data_url(make_image(280, 280, seed=2)), "https://example.com/cat.png"
    tokens = media_tokens([chat_prompt(small, remote), pb.PromptInput(text="x", images=[pb.ImageInput(url=small)])], COSTS)
    assert tokens == 2 * COST.image_tokens(280, 280) + COST.image_tokens(1024, 1024) == 2 * 100 + 1369


def test_a_clip_is_priced_from_its_mp4_header_and_an_unreadable_one_as_a_typical_clip():
    clip = make_clip(40, 10, 96, 64)  # 4 s: 8 frames at 2 per second, 4 groups of one 96x64 frame
    video = pb.PromptInput(text="x", videos=[pb.VideoInput(url=data_url(clip, "video/mp4"))])
    assert media_tokens([video], COSTS) == 4 * COST.image_tokens(96, 64)
    faster = pb.PromptInput(text="x", videos=[pb.VideoInput(data=clip)], video_options=pb.VideoOptions(fps=4.0))
    assert media_tokens([faster], COSTS) == 8 * COST.image_tokens(96, 64)
    unknown = pb.PromptInput(text="x", videos=[pb.VideoInput(url="https://example.com/clip.webm")])
    assert media_tokens([unknown], COSTS) == 20 * COST.image_tokens(640, 360)  # 20 s of 360p at 2 frames per second
    assert media_tokens([video], MediaCosts(COST)) == 0  # no video rule: the family refuses clips itself


def budget(tokens_per_encoder: int, num_encoders: int = 1) -> tuple[MediaBudget, list]:
    fetched = []

    async def fetch() -> str:
        fetched.append(1)
        return media_costs_to_json(COSTS)

    return MediaBudget(tokens_per_encoder, lambda: num_encoders, fetch), fetched


def test_large_requests_leave_the_reserve_to_small_ones_which_are_refused_only_when_it_is_full():
    media, _ = budget(1000)  # a reserve of 250 for requests of at most 62; a large one sees 750
    assert (media.reserve, media.is_small(62), media.is_small(63)) == (250, True, False)
    big = media.take(700)
    with pytest.raises(GatewayError) as info:
        media.take(100)
    assert info.value.status == 429 and info.value.headers["Retry-After"] and "250 of them kept for small requests" in info.value.message
    smalls = [media.take(60) for _ in range(5)]  # 1000 in flight: the whole budget
    with pytest.raises(GatewayError):
        media.take(1)
    assert (media.num_refused, media.num_small_refused) == (2, 1)
    big.release()
    big.release()  # once only
    assert media.num_in_flight == 300
    for ticket in smalls:
        ticket.release()
    assert media.num_in_flight == 0


def test_under_any_mix_large_requests_never_hold_the_reserve_and_small_ones_pass_while_it_has_room():
    rng = random.Random(7)
    media, _ = budget(1000)
    held: list[tuple[bool, MediaTicket]] = []
    for _ in range(2000):
        if held and rng.random() < 0.45:
            held.pop(rng.randrange(len(held)))[1].release()
            continue
        size = rng.choice([rng.randint(1, 62), rng.randint(63, 750)])
        small = media.is_small(size)
        small_in_flight = sum(t.num_tokens for s, t in held if s)
        try:
            held.append((small, media.take(size)))
        except GatewayError as exc:
            assert exc.status == 429
            # Refused small: the other small requests fill the reserve (large ones never reach it).
            assert not small or small_in_flight + size > media.reserve
        large_in_flight = sum(t.num_tokens for s, t in held if not s)
        assert large_in_flight <= media.capacity - media.reserve and media.num_in_flight <= media.capacity


def test_a_request_over_the_whole_budget_is_a_413_naming_it_and_the_budget_grows_with_encoders():
    media, _ = budget(1000, num_encoders=2)
    assert media.capacity == 2000
    with pytest.raises(GatewayError) as info:
        media.take(2001)
    assert info.value.status == 413 and "max_media_tokens_per_encoder 1000 x 2 encoders" in info.value.message
    assert media.num_too_large == 1 and media.num_in_flight == 0
    # A large request may hold the budget less the reserve, and no more, however empty it is.
    media.take(1500).release()
    with pytest.raises(GatewayError) as info:
        media.take(1501)
    assert info.value.status == 413 and "at most 1500 for one request" in info.value.message and "less the 500 kept" in info.value.message


def test_requests_without_images_pass_free_and_the_cost_model_is_fetched_once():
    media, fetched = budget(10_000)
    free = asyncio.run(media.admit([pb.PromptInput(text="hello")]))
    assert free.num_tokens == 0 and fetched == []
    image = image_data_url(make_image(280, 280, seed=3))
    for _ in range(2):
        asyncio.run(media.admit([chat_prompt(image)])).release()
    assert fetched == [1]
    off, off_fetched = budget(0)
    assert asyncio.run(off.admit([chat_prompt(image)])).num_tokens == 0 and off_fetched == []


def test_the_encoders_measured_rate_sets_retry_after_and_is_asked_again_after_its_ttl():
    now, rates = [0.0], [0.01, 0.02]

    async def rate() -> float | None:
        return rates.pop(0)

    async def fetch() -> str:
        return media_costs_to_json(COSTS)

    media = MediaBudget(1000, lambda: 2, fetch, rate, clock=lambda: now[0])
    image = image_data_url(make_image(280, 280, seed=3))  # 100 tokens
    held = [asyncio.run(media.admit([chat_prompt(image)])) for _ in range(3)]
    assert media.seconds_per_token == 0.01 and rates == [0.02]  # asked once within its TTL
    assert media.tower_seconds_in_flight == pytest.approx(3.0)
    with pytest.raises(GatewayError) as info:
        media.take(1300)
    assert info.value.headers["Retry-After"] == "2"  # 3 s of tower over 2 encoders, rounded up
    assert "about 3.0 s of vision tower" in info.value.message
    with pytest.raises(GatewayError) as too_large:
        media.take(2001)
    assert "about 20.0 s of vision tower" in too_large.value.message
    now[0] = TOWER_RATE_TTL_S + 1
    asyncio.run(media.admit([chat_prompt(image)]))
    assert media.seconds_per_token == 0.02 and rates == []
    for ticket in held:
        ticket.release()


class CostingPipeline(FakePipeline):
    async def media_cost_json(self) -> str:
        return media_costs_to_json(COSTS)


def test_through_the_api_an_oversized_request_is_a_413_before_any_work_and_the_budget_frees():
    pipeline = CostingPipeline()
    http, state = client_for(pipeline, max_media_tokens_per_encoder=500)
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)
    huge = image_data_url(make_image(1200, 900, seed=4))
    content = [{"type": "image_url", "image_url": {"url": huge}}, {"type": "text", "text": "?"}]
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}], max_tokens=3)
    assert info.value.status_code == 413 and "vision tokens" in info.value.message and pipeline.calls == []
    small = [{"type": "image_url", "image_url": {"url": image_data_url(make_image(100, 100, seed=5))}}]
    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": small}], max_tokens=3)
    assert len(pipeline.calls) == 1 and state.media.num_in_flight == 0
    assert state.own_metrics.num_media_too_large.value == 1


# --- Hostile headers: pricing gives a size or gives way to preprocessing, and never raises ---


def test_a_bomb_a_zero_side_and_every_damaged_image_are_given_way_to_preprocessing():
    for name, data in damaged_images().items():
        size = bytes_size(data)
        assert size is None or (size[0] > 0 and size[1] > 0), name
        assert image_size(data_url(data)) == size, name
    for lying in ("png bomb 60000x60000", "png 0x0", "png 0x48", "jpeg 0x0", "gif 0x0", "webp bomb 16384x16384"):
        assert bytes_size(damaged_images()[lying]) is None, lying
    urls = [data_url(data) for data in damaged_images().values()]
    priced = sum(COST.image_tokens(*(bytes_size(data) or (1024, 1024))) for data in damaged_images().values())
    assert media_tokens([chat_prompt(*urls)], COSTS) == priced


def test_a_clip_header_that_states_no_usable_clip_is_priced_as_a_typical_clip():
    clips = {**damaged_clips(), **lying_clip_headers()}
    for name in ("no frames", "zero timescale", "zero duration", "0x0 track", "truncated", "moov type flipped", "all ones"):
        assert clip_header(clips[name]) is None, name
    assert clip_header(clips["65535x65535 track"]).width == 65535  # a size, priced within the family's pixel bound
    for name, clip in clips.items():
        prompt = pb.PromptInput(text="x", videos=[pb.VideoInput(data=clip)], video_options=pb.VideoOptions(max_pixels=1))
        assert media_tokens([prompt], COSTS) > 0, name
        assert media_tokens([prompt], MediaCosts(COST, dataclasses.replace(CLIP_COST, clip_pixel_budget=True))) > 0, name


EXTREMES = (b"\x00\x00\x00\x00", b"\xff\xff\xff\xff", b"\x80\x00\x00\x00", b"\x00\x00\x00\x01")  # 0, -1, 2^31, 1


def _mutated(seed: bytes, data: st.DataObject) -> bytes:
    """``seed`` with a few bytes flipped, overwritten with extreme values, cut short or repeated."""
    out = bytearray(seed)
    for _ in range(data.draw(st.integers(1, 6))):
        if not out:
            break
        at = data.draw(st.integers(0, len(out) - 1))
        kind = data.draw(st.sampled_from(("flip", "extreme", "cut", "repeat")))
        if kind == "flip":
            out[at] ^= data.draw(st.integers(1, 255))
        elif kind == "extreme":
            out[at : at + 4] = data.draw(st.sampled_from(EXTREMES))
        elif kind == "cut":
            del out[at:]
        else:
            out[at:at] = out[at : at + data.draw(st.integers(1, 64))]
    return bytes(out)


def _seeds() -> list[bytes]:
    image = make_image(40, 30, seed=5)
    formats = [encode_image(image, fmt) for fmt in ("PNG", "JPEG", "WEBP", "GIF")]
    return [*formats, *damaged_images().values(), mp4_clip(), *damaged_clips().values(), *lying_clip_headers().values()]


SEEDS = _seeds()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_headers_are_priced_or_given_way_and_pricing_never_raises(data):
    blob = _mutated(data.draw(st.sampled_from(SEEDS)), data) if data.draw(st.booleans()) else data.draw(st.binary(max_size=512))
    size = bytes_size(blob)
    assert size is None or (size[0] > 0 and size[1] > 0)
    clip = clip_header(blob)
    assert clip is None or (clip.num_frames > 0 and clip.fps > 0 and clip.width > 0 and clip.height > 0)
    as_url = data_url(blob)
    prompt = pb.PromptInput(text="x", images=[pb.ImageInput(url=as_url), pb.ImageInput(data=blob)], videos=[pb.VideoInput(data=blob)])
    assert media_tokens([prompt], COSTS) > 0
