"""Video processing against transformers' own video processors as AutoVideoProcessor builds them
from each checkpoint, with real torchvision (tests/video_oracle.py): the samplers' frame indices,
the settings' defaults, and each clip's pixels, grids, timestamps and positions. Three
checkpoints: the Qwen2-VL built-in; the Qwen3-VL built-in, which ships no video processor file and
so gets Qwen2VLVideoProcessor; the Qwen3-VL Hub layout, whose file names Qwen3VLVideoProcessor."""

from __future__ import annotations

import pytest
import torch

from services.models.qwen2_vl.video_processor import QWEN2_VL_VIDEO_DEFAULTS, SERVING_FPS
from services.models.video import VideoMetadata, VideoOptions, VideoProcessingError
from services.preprocess.video_decode import decode_frames
from shared.types import GroupPlacement
from tests.factories import make_clip
from tests.reference_processors import reference_processors
from tests.video_oracle import oracle_video

# (frames in the clip, its frame rate): short and long, integral and NTSC rates.
GOLDEN_CLIPS = [(4, 2.0), (8, 30.0), (30, 10.0), (95, 24.0), (150, 29.97), (301, 25.0), (900, 60.0), (1799, 23.976)]
REQUESTS = [VideoOptions(), VideoOptions(fps=1.0), VideoOptions(fps=4.5), VideoOptions(num_frames=8), VideoOptions(fps=3, max_frames=6)]


def _processor(model: str):
    """The model's video processor (a built-in's name or a checkpoint directory), and the model."""
    from services.models.family import ImageOptions
    from services.models.registry import resolve_model

    ref = resolve_model(model, progress=lambda _m: None)
    family = ref.family
    config = family.read_config(ref.path)
    return family.video_processor(ref.path, config, family.image_processor(ref.path, ImageOptions())), ref


@pytest.fixture(scope="module", params=["tiny", "qwen3vl-tiny", "qwen3-vl-2b"])
def checkpoint(request, tmp_path_factory) -> str:
    """A built-in's name, or a Hub layout's directory."""
    if request.param.startswith("qwen3-vl"):
        from tests.hub_layouts import write_layout

        return str(write_layout(request.param, tmp_path_factory.mktemp("layout")))
    return request.param


def _hf_indices(model_dir, rule: str, total: int, fps: float, options: VideoOptions) -> list[int]:
    """transformers' own sample_frames for the same metadata and request, the processor built
    with the request's frame bounds."""
    bounds = {k: v for k, v in (("min_frames", options.min_frames), ("max_frames", options.max_frames)) if v is not None}
    rate = options.fps
    if rule == "Qwen2VLVideoProcessor" and options.num_frames is None:
        rate = options.fps or SERVING_FPS  # Tessera's serving rate where nothing names one
    return reference_processors().sample(model_dir, total, fps, processor_kwargs=bounds, num_frames=options.num_frames, fps=rate)


def test_each_checkpoint_gets_the_video_processor_transformers_builds(checkpoint):
    processor, ref = _processor(checkpoint)
    built = oracle_video(make_clip(8, fps=4, width=64, height=48), ref.path).processor
    assert processor.rule == built
    expected = {"tiny": "Qwen2VLVideoProcessor", "qwen3vl-tiny": "Qwen2VLVideoProcessor"}.get(checkpoint, "Qwen3VLVideoProcessor")
    assert built == expected


def test_frame_indices_equal_transformers_sampler_on_every_golden_clip(checkpoint):
    processor, ref = _processor(checkpoint)
    for total, fps in GOLDEN_CLIPS:
        for options in REQUESTS:
            metadata = VideoMetadata(total, fps, 64, 48)
            try:
                expected = _hf_indices(ref.path, processor.rule, total, fps, options)
            except RuntimeError:  # transformers refused: so does Tessera
                with pytest.raises(VideoProcessingError):
                    processor.sample(metadata, options)
                continue
            if len(expected) < processor.temporal_patch_size:
                with pytest.raises(VideoProcessingError):
                    processor.sample(metadata, options)
                continue
            assert list(processor.sample(metadata, options).indices) == expected, (total, fps, options)


def test_video_defaults_are_transformers_class_defaults():
    names = [name for name in QWEN2_VL_VIDEO_DEFAULTS if name != "size"]
    theirs = reference_processors().class_defaults("Qwen2VLVideoProcessor", [*names, "size"])
    for name in names:
        value = theirs[name]
        assert (list(value) if isinstance(value, tuple) else value) == QWEN2_VL_VIDEO_DEFAULTS[name], name
    assert {k: theirs["size"][k] for k in ("shortest_edge", "longest_edge")} == QWEN2_VL_VIDEO_DEFAULTS["size"]


@pytest.mark.parametrize("frames,fps,size", [(30, 10, (64, 48)), (13, 5, (100, 40)), (60, 24, (30, 90)), (16, 4, (112, 112))])
def test_groups_are_transformers_video_rows_bitwise(checkpoint, frames, fps, size):
    processor, ref = _processor(checkpoint)
    data = make_clip(frames, fps=fps, width=size[0], height=size[1], seed=frames)
    oracle = oracle_video(data, ref.path)
    clip = processor.sample(VideoMetadata(frames, float(fps), size[0], size[1]), VideoOptions())
    assert list(clip.indices) == oracle.indices
    video = processor.process(decode_frames(data, clip.indices), clip, VideoOptions())
    grid_t, grid_h, grid_w = oracle.video_grid_thw
    assert [g.grid_thw for g in video.groups] == [(1, grid_h, grid_w)] * grid_t
    assert torch.equal(torch.cat([g.pixel_values for g in video.groups]), oracle.pixel_values_videos)


def test_qwen3_vl_timestamps_are_the_processors():
    processor, _ = _processor("qwen3vl-tiny")
    clip = processor.sample(VideoMetadata(95, 24.0, 64, 48), VideoOptions())
    from transformers import Qwen3VLProcessor

    expected = Qwen3VLProcessor._calculate_timestamps(None, list(clip.indices), 24.0, 2)
    assert processor._timestamps(clip) == tuple(expected)
    assert len(expected) == (len(clip.indices) + 1) // 2


def test_qwen2_5_vl_groups_are_spaced_by_seconds(tmp_path):
    from tests.hub_layouts import write_layout

    path = write_layout("qwen2.5-vl", tmp_path / "q25")
    processor, _ = _processor(str(path))
    clip = processor.sample(VideoMetadata(40, 10.0, 64, 48), VideoOptions(fps=2))
    placements = processor._placements(clip, 4)
    # 8 frames of 40 at 10 fps: sampled at 2 fps, 1 s per group, 2 tokens per second.
    assert placements == tuple(GroupPlacement(index=k, time_position=2 * k) for k in range(4))


def test_request_settings_override_the_deployments_as_vllm_merges_them():
    defaults = VideoOptions(num_frames=16, max_pixels=50176)
    assert VideoOptions().over(defaults) == defaults
    assert VideoOptions(fps=1.0).over(defaults) == VideoOptions(fps=1.0, max_pixels=50176)  # fps drops the default num_frames
    assert VideoOptions(num_frames=8).over(VideoOptions(fps=4.0)) == VideoOptions(num_frames=8)
    assert VideoOptions(min_pixels=3136).over(defaults) == VideoOptions(num_frames=16, min_pixels=3136, max_pixels=50176)


def test_the_deployments_settings_are_checked_at_start_up():
    from services.preprocess.config import PreprocessConfig

    assert PreprocessConfig(mm_processor_kwargs='{"fps": 1}').video_defaults() == VideoOptions(fps=1)
    for bad in ('{"bogus": 1}', '{"fps": 1, "num_frames": 4}', "[1]", "{"):
        with pytest.raises(ValueError, match="mm_processor_kwargs"):
            PreprocessConfig(mm_processor_kwargs=bad)
