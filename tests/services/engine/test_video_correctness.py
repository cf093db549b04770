"""Video requests are exact: greedy float32 output equals transformers' generate with the same
sampled frames, for Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3.5, cold and on every cache path (processor,
encoder, prefix), for a clip that shares groups with an earlier one, and beside images."""

from __future__ import annotations

import pytest

from services.engine.config import EngineConfig
from services.engine.llm import LLM
from services.engine.sampling_params import SamplingParams
from services.models.registry import resolve_model
from tests.factories import Video, chat_case, encode_image, make_clip, make_image
from tests.oracle import ReferenceOracle, assert_tokens_match
from tests.video_oracle import oracle_case_tokens

GREEDY_8 = SamplingParams(max_tokens=8, ignore_eos=True)
BLOCK = 16


@pytest.fixture(scope="module", params=["tiny", "qwen3vl-tiny", "qwen2.5-vl", "qwen3_5-tiny"])
def model_path(request, tmp_path_factory):
    if request.param == "qwen2.5-vl":
        from tests.hub_layouts import write_layout

        return write_layout("qwen2.5-vl", tmp_path_factory.mktemp("q25"))
    return resolve_model(request.param, progress=lambda _m: None).path


@pytest.fixture(scope="module")
def video_oracle(model_path) -> ReferenceOracle:
    return ReferenceOracle(model_path)


def _llm(model_path) -> LLM:
    return LLM(str(model_path), EngineConfig(block_size=BLOCK))


def _clip(num_frames: int, fps: int = 2, seed: int = 1, size: tuple[int, int] = (64, 48)) -> bytes:
    return make_clip(num_frames, fps=fps, width=size[0], height=size[1], seed=seed)


def test_cold_and_repeated_video_match_transformers_on_every_cache_path(model_path, video_oracle):
    llm = _llm(model_path)
    case = chat_case(Video(_clip(10, fps=5)), "What happens in this video?")
    expected = oracle_case_tokens(video_oracle, case, 8)
    [cold] = llm.generate([case.prompt], GREEDY_8)
    assert_tokens_match(cold.token_ids, expected, context="cold")
    groups = llm.engine.runner.vision.num_items_encoded
    decoded = llm.preprocessor.videos.num_decoded
    assert groups >= 2 and decoded == 1
    [again] = llm.generate([case.prompt], GREEDY_8)  # processor-cache, encoder-cache and prefix hit
    assert again.token_ids == cold.token_ids
    assert again.usage.cached_tokens == (cold.usage.prompt_tokens - 1) // BLOCK * BLOCK > 0
    assert llm.preprocessor.videos.num_decoded == decoded  # a repeat of the file is not decoded again
    assert llm.engine.runner.vision.num_items_encoded == groups


def test_same_clip_after_other_text_hits_the_encoder_cache_only(model_path, video_oracle):
    llm = _llm(model_path)
    clip = Video(_clip(8, seed=2))
    llm.generate([chat_case("First look at this.", clip).prompt], GREEDY_8)
    groups = llm.engine.runner.vision.num_items_encoded
    case = chat_case("Now something else entirely, then", clip)
    [result] = llm.generate([case.prompt], GREEDY_8)
    assert llm.engine.runner.vision.num_items_encoded == groups  # every group from the encoder cache
    assert_tokens_match(result.token_ids, oracle_case_tokens(video_oracle, case, 8), context="encoder hit")


def test_a_growing_clip_encodes_only_its_new_groups(model_path, video_oracle):
    """Clip B is clip A with 4 more frames (an agent's growing recording): at 2 frames per
    second of a 2 fps clip every frame is sampled, so B's first groups are A's. (Qwen3-VL sizes
    a clip by its whole length within a pixel budget: these frames keep their size at 8 and 12.)"""
    llm = _llm(model_path)
    short, long = _clip(8, seed=3, size=(128, 96)), _clip(12, seed=3, size=(128, 96))
    llm.generate([chat_case(Video(short), "Describe.").prompt], GREEDY_8)
    encoded = llm.engine.runner.vision.num_items_encoded
    case = chat_case(Video(long), "Describe.")
    prep = llm.preprocessor.preprocess(case.prompt)
    assert len(prep.mm_items) == 6
    [result] = llm.generate([case.prompt], GREEDY_8)
    assert llm.engine.runner.vision.num_items_encoded - encoded == 2  # the two new groups only
    assert_tokens_match(result.token_ids, oracle_case_tokens(video_oracle, case, 8), context="growing clip")


def test_video_beside_images_and_request_sampling(model_path, video_oracle):
    llm = _llm(model_path)
    image = encode_image(make_image(56, 84, seed=4))
    case = chat_case(image, "and", Video(_clip(12, fps=4, seed=5)), "compare them.", mm_processor_kwargs={"fps": 1.0})
    [result] = llm.generate([case.prompt], GREEDY_8)
    assert_tokens_match(result.token_ids, oracle_case_tokens(video_oracle, case, 8, fps=1.0), context="image and video")
