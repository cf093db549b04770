"""Video through every role of the default stack, driven by the official openai client: exact
against transformers, each temporal group encoded once, /tokenize counting as the chat request
does, and each kind of bad clip a 4xx that names what was wrong while the stack keeps serving.
Per Qwen family, on stacks of their own: a decode node killed while video streams run on it, whose streams
migrate to the other decode node and stay exact, token for token."""

from __future__ import annotations

import os
import secrets
import signal

import httpx
import numpy as np
import pytest
from openai import APIStatusError

from services.bench.cache_rates import TOWER_RUNS
from tests.factories import Video, chat_case, data_url, make_clip, make_clip_of_unknown_codec, make_clip_without_frame_rate
from tests.services.stack.conftest import launch_stack, stop_stack
from tests.services.stack.e2e_helpers import GREEDY, client_for
from tests.services.stack.stack_probes import Streams, busiest_decode_node
from tests.video_oracle import oracle_case_tokens

# Video streams still decoding once their decode node is found and killed: a tiny model decodes
# 96 tokens in a fraction of a second, and a loaded machine takes a while to find the node.
MIGRATION_TOKENS = 512
MIGRATION_TIE_MARGIN = 1e-3  # a divergence after migration is allowed only at an oracle near-tie


def _tower_runs(stack) -> float:
    """Items through a vision tower anywhere: on the encoder tier or on a prefill node's own."""
    metrics = stack.metrics()
    return sum(metrics.get(name, 0.0) for name in TOWER_RUNS)


def _ask(stack, case, **extra):
    body = {**GREEDY, "extra_body": {**GREEDY["extra_body"], **extra}}
    return client_for(stack).chat.completions.create(model="tiny", messages=case.body["messages"], **body)


def test_a_video_request_equals_the_oracle_and_each_group_is_encoded_once(stack, oracle):
    case = chat_case(Video(make_clip(16, fps=4, width=80, height=60, seed=40)), "What moves in this clip?")
    expected = oracle_case_tokens(oracle, case, 12)
    encoded = _tower_runs(stack)
    reply = _ask(stack, case)
    assert reply.choices[0].message.content == oracle.tokenizer.decode(expected.token_ids, skip_special_tokens=True)
    num_groups = _tower_runs(stack) - encoded
    assert num_groups == 4  # 16 frames at 4 fps, sampled at 2 fps: 8 frames, 4 groups
    again = _ask(stack, case)
    assert again.choices[0].message.content == reply.choices[0].message.content
    assert _tower_runs(stack) - encoded == num_groups  # no group encoded twice
    tokenized = httpx.post(
        stack.base_url.removesuffix("/v1") + "/tokenize", json={"model": "tiny", "messages": case.body["messages"]}, timeout=60
    ).json()
    assert tokenized["count"] == reply.usage.prompt_tokens


def test_request_sampling_settings_change_the_frames_and_stay_exact(stack, oracle):
    case = chat_case(Video(make_clip(12, fps=4, width=64, height=48, seed=41)), "Describe.")
    reply = _ask(stack, case, mm_processor_kwargs={"fps": 4})
    expected = oracle_case_tokens(oracle, case, 12, fps=4.0)
    assert reply.choices[0].message.content == oracle.tokenizer.decode(expected.token_ids, skip_special_tokens=True)


def _many_frames_clip() -> bytes:
    frame = np.zeros((16, 16, 3), np.uint8)
    return make_clip(frames=[frame + i % 200 for i in range(800)], fps=100)


@pytest.mark.parametrize(
    "url,kwargs,status,text",
    [
        (data_url(b"this is not a video", "video/mp4"), {}, 400, "not a video container"),
        (data_url(make_clip(30)[:3000], "video/mp4"), {}, 400, "invalid_video"),
        (data_url(make_clip(3, fps=2), "video/mp4"), {"num_frames": 8}, 400, "cannot sample 8 frames"),
        (data_url(make_clip(1, fps=2), "video/mp4"), {}, 400, "at least 2"),
        (data_url(make_clip_without_frame_rate(), "video/x-matroska"), {}, 400, "frame rate is unknown or zero"),
        (data_url(make_clip_of_unknown_codec(), "video/x-matroska"), {}, 400, "codec is not supported"),
        ("data:image/png;base64,AAAA", {}, 400, "expected video/*"),
        (data_url(make_clip(4), "video/mp4"), {"fps": 2, "num_frames": 4}, 400, "mutually exclusive"),
        (data_url(make_clip(4), "video/mp4"), {"temporal_patch_size": 4}, 400, "temporal_patch_size"),
        ("http://127.0.0.1:9/clip.mp4", {}, 403, "non-public address"),
    ],
)
def test_bad_videos_get_a_clear_4xx_and_the_stack_keeps_serving(stack, url, kwargs, status, text):
    messages = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": "?"}]}]
    extra = {"mm_processor_kwargs": kwargs} if kwargs else {}
    with pytest.raises(APIStatusError) as info:
        client_for(stack).chat.completions.create(model="tiny", messages=messages, max_tokens=2, extra_body=extra)
    assert info.value.status_code == status and text in info.value.message, info.value.message
    ok = client_for(stack).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "still alive?"}], **GREEDY)
    assert ok.usage.completion_tokens == 12


def test_a_clip_over_the_frame_limit_is_a_413_naming_it(stack):
    messages = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": data_url(_many_frames_clip(), "video/mp4")}}]}]
    extra = {"mm_processor_kwargs": {"fps": 100, "max_frames": 800}}
    with pytest.raises(APIStatusError) as info:
        client_for(stack).chat.completions.create(model="tiny", messages=messages, max_tokens=2, extra_body=extra)
    assert info.value.status_code == 413 and "max_video_frames" in info.value.message


def test_a_raw_prompt_with_a_video_on_the_completions_endpoint_equals_the_chat_request(stack, oracle):
    clip = make_clip(8, fps=4, width=64, height=48, seed=42)
    case = chat_case(Video(clip), "Say what you see.")
    chat = _ask(stack, case)
    prompt = oracle.chat_text(case.oracle_messages)  # the template's text, its one video marker included
    assert prompt.count("<|video_pad|>") == 1
    reply = client_for(stack).completions.create(
        model="tiny", prompt=prompt, max_tokens=12, temperature=0,
        extra_body={"ignore_eos": True, "multi_modal_data": {"video": data_url(clip, "video/mp4")}},
    )  # fmt: skip
    assert reply.usage.prompt_tokens == chat.usage.prompt_tokens
    assert reply.choices[0].text == chat.choices[0].message.content


@pytest.fixture(scope="module", params=["tiny", "qwen3vl-tiny", "qwen2.5-vl"])
def two_decode_stack(request, tmp_path_factory, repo_root):
    """A 2/2/2 stack (two encoder, two prefill and two decode nodes), round-robin placement (so a migrated stream's
    new prefill may land on the other prefill node), and the family's oracle. Qwen2.5-VL has no
    built-in: its checkpoint is written in the Hub's layout and served from that directory."""
    from tests.oracle import ReferenceOracle

    model_dir = _model_dir(request.param, tmp_path_factory)
    running = launch_stack(
        tmp_path_factory.mktemp(f"video-migration-{request.param}"),
        repo_root,
        *("--model", str(model_dir), "--served-model-name", request.param),
        *("--encoders", "2", "--prefill", "2", "--decode", "2", "--routing-policy", "round_robin", "--no-restart"),
        internal_secret=secrets.token_hex(16),  # to read the decode nodes' Stats
    )
    running.served_model = request.param
    yield running, ReferenceOracle(model_dir)
    stop_stack(running)


def _model_dir(name: str, tmp_path_factory):
    if name == "qwen2.5-vl":
        from tests.hub_layouts import write_layout

        return write_layout(name, tmp_path_factory.mktemp("q25"))
    from services.models.registry import resolve_model

    return resolve_model(name, progress=lambda _m: None).path


def test_a_decode_node_killed_mid_video_stream_migrates_and_stays_exact(two_decode_stack):
    """The killed node is the one running the most streams, each of them a clip of several
    temporal groups; every stream continues elsewhere (its prompt and the tokens already streamed
    prefilled again) and equals transformers' greedy generate for the same sampled frames."""
    stack, oracle = two_decode_stack
    cases = [
        chat_case(Video(make_clip(16, fps=4, width=64 + 16 * i, height=48, seed=60 + i)), f"What happens in clip {i}?") for i in range(2)
    ]  # 16 frames at 4 fps, sampled at 2 fps: 8 frames, 4 temporal groups each
    expected = [oracle_case_tokens(oracle, case, MIGRATION_TOKENS) for case in cases]
    greedy = {**GREEDY, "max_tokens": MIGRATION_TOKENS, "logprobs": True}
    migrations = stack.metrics().get("tessera_gateway_migrations_total", 0.0)
    streams = Streams(stack, cases, greedy, model=stack.served_model)
    streams.wait_flowing(1)  # every stream decoding now has nearly all its tokens ahead of it
    os.kill(busiest_decode_node(stack)["pid"], signal.SIGKILL)
    texts, errors = streams.join()
    assert not errors, (errors, stack.log_tail())
    # Token for token: each streamed token's own text (the decode node's tokenizer.decode([id])),
    # up to a first divergence only where the oracle's top-2 margin is below MIGRATION_TIE_MARGIN:
    # the streamed tokens are prefilled again on the new node, whose KV then differs from the
    # decoded one by float rounding (clip 1's closest call on `tiny` is 3.7e-4 at step 274).
    for i, out in enumerate(expected):
        wanted = [oracle.tokenizer.decode([t]) for t in out.token_ids]
        step = next((s for s, (ours, theirs) in enumerate(zip(streams.tokens[i], wanted)) if ours != theirs), None)
        if step is None:
            assert streams.tokens[i] == wanted, f"clip {i}"
            assert texts[i] == oracle.tokenizer.decode(out.token_ids, skip_special_tokens=True), f"clip {i}"
        else:
            margin = out.top2_margin(step)
            assert margin < MIGRATION_TIE_MARGIN, f"clip {i} diverged at step {step}, where the oracle's margin {margin:.3g} is no tie"
    num_migrated = stack.metrics().get("tessera_gateway_migrations_total", 0.0) - migrations
    print(f"{stack.served_model}: {num_migrated:.0f} video streams migrated")
    assert num_migrated > 0


@pytest.fixture(scope="module")
def tight_cache_stack(tmp_path_factory, repo_root, tiny_model):
    """The default stack with an embedding cache of three temporal groups' rows on every node."""
    from services.preprocess.preprocessor import Preprocessor

    prep = Preprocessor(tiny_model).preprocess(chat_case(Video(_long_clip()), "?").prompt)
    rows = 3 * max(item.placeholder.length for item in prep.mm_items)
    env = {**os.environ, "TESSERA_ENGINE_ENCODER_CACHE_TOKENS": str(rows), "TESSERA_ENGINE_MAX_ENCODER_TOKENS_PER_STEP": str(rows)}
    running = launch_stack(tmp_path_factory.mktemp("video-tight-cache"), repo_root, env=env)
    yield running, len(prep.mm_items)
    stop_stack(running)


def _long_clip() -> bytes:
    return make_clip(48, fps=4, width=80, height=60, seed=70)  # 12 s sampled at 2 fps: 12 groups


def test_a_clip_four_times_the_embedding_cache_streams_through_prefill_and_stays_exact(tight_cache_stack, oracle):
    """Each node's embedding cache holds three of the clip's twelve groups: the prefill node
    brings them window by window as its engine computes past them (never refused for its size),
    and the answer equals transformers' greedy generate."""
    stack, num_groups = tight_cache_stack
    assert num_groups == 12
    case = chat_case(Video(_long_clip()), "What changes over this clip?")
    expected = oracle_case_tokens(oracle, case, 12)
    windows = stack.metrics().get("tessera_prefill_embedding_windows_total", 0.0)
    reply = _ask(stack, case)
    assert reply.choices[0].message.content == oracle.tokenizer.decode(expected.token_ids, skip_special_tokens=True)
    assert stack.metrics().get("tessera_prefill_embedding_windows_total", 0.0) - windows >= 3
