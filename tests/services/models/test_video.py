"""Video processing against transformers: the samplers' frame indices, the settings' defaults,
and each clip's pixels, grids, timestamps and positions (tests/video_oracle.py says how the
oracle is computed without torchvision)."""

from __future__ import annotations

import pytest
import torch
from transformers.video_utils import VideoMetadata as HFMetadata

from services.models.qwen2_vl.video_processor import QWEN2_VL_VIDEO_DEFAULTS, SERVING_FPS
from services.models.video import VideoMetadata, VideoOptions, VideoProcessingError
from services.preprocess.video_decode import decode_frames
from shared.types import GroupPlacement
from tests.factories import make_clip
from tests.video_oracle import hf_video_processor, oracle_video, qwen2_vl_video_processor_class

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


def _hf_indices(model_type: str, total: int, fps: float, options: VideoOptions) -> list[int]:
    """transformers' own sample_frames for the same metadata and request."""
    metadata = HFMetadata(total_num_frames=total, fps=fps, width=64, height=48)
    bounds = {k: v for k, v in (("min_frames", options.min_frames), ("max_frames", options.max_frames)) if v is not None}
    if model_type == "qwen3_vl":  # its sampler reads the processor's own bounds
        hf = hf_video_processor("qwen3_vl", **bounds)
        picked = hf.sample_frames(metadata, num_frames=options.num_frames, fps=options.fps)
    else:
        hf = hf_video_processor("qwen2_vl")
        rate = None if options.num_frames is not None else options.fps or SERVING_FPS
        picked = hf.sample_frames(metadata, num_frames=options.num_frames, fps=rate, **bounds)
    return [int(i) for i in picked]


@pytest.mark.parametrize("model_name,model_type", [("tiny", "qwen2_vl"), ("qwen3vl-tiny", "qwen3_vl")])
def test_frame_indices_equal_transformers_sampler_on_every_golden_clip(model_name, model_type):
    processor, _ = _processor(model_name)
    for total, fps in GOLDEN_CLIPS:
        for options in REQUESTS:
            metadata = VideoMetadata(total, fps, 64, 48)
            try:
                expected = _hf_indices(model_type, total, fps, options)
            except (ValueError, ZeroDivisionError):
                with pytest.raises(VideoProcessingError):
                    processor.sample(metadata, options)
                continue
            if len(expected) < processor.temporal_patch_size:
                with pytest.raises(VideoProcessingError):
                    processor.sample(metadata, options)
                continue
            assert list(processor.sample(metadata, options).indices) == expected, (total, fps, options)


def test_qwen2_vl_defaults_are_transformers_class_defaults():
    hf = qwen2_vl_video_processor_class()()  # a processor with no settings of its own: the class's defaults
    for name, value in QWEN2_VL_VIDEO_DEFAULTS.items():
        theirs = getattr(hf, name)
        if name == "size":
            theirs = {"shortest_edge": theirs.shortest_edge, "longest_edge": theirs.longest_edge}
        assert (list(theirs) if isinstance(theirs, tuple) else theirs) == value, name


@pytest.mark.parametrize("model_name", ["tiny", "qwen3vl-tiny"])
@pytest.mark.parametrize("frames,fps,size", [(30, 10, (64, 48)), (13, 5, (100, 40)), (60, 24, (30, 90))])
def test_groups_are_transformers_video_rows_bitwise(model_name, frames, fps, size):
    processor, ref = _processor(model_name)
    data = make_clip(frames, fps=fps, width=size[0], height=size[1], seed=frames)
    from transformers import AutoImageProcessor

    model_type = ref.family.read_config(ref.path).model_type
    oracle = oracle_video(data, model_type, ref.path, AutoImageProcessor.from_pretrained(str(ref.path)))
    clip = processor.sample(VideoMetadata(frames, float(fps), size[0], size[1]), VideoOptions())
    assert list(clip.indices) == oracle.indices
    video = processor.process(decode_frames(data, clip.indices), clip, VideoOptions())
    grid_t, grid_h, grid_w = oracle.video_grid_thw
    assert [g.grid_thw for g in video.groups] == [(1, grid_h, grid_w)] * grid_t
    assert torch.equal(torch.cat([g.pixel_values for g in video.groups]), oracle.pixel_values_videos)


def test_qwen2_vl_frames_resize_as_the_image_processor_resizes_them():
    """The proof frame by frame: transformers' image processor, resize on, with the video's
    per-frame bounds, gives each frame the rows our group holds for it in its temporal slot."""
    processor, ref = _processor("tiny")
    from transformers import AutoImageProcessor

    image_processor = AutoImageProcessor.from_pretrained(str(ref.path))
    data = make_clip(8, fps=4, width=150, height=70, seed=5)
    clip = processor.sample(VideoMetadata(8, 4.0, 150, 70), VideoOptions())
    frames = decode_frames(data, clip.indices)
    video = processor.process(frames, clip, VideoOptions())
    bounds = processor.kwargs_for_hash(VideoOptions())["size"]
    for k, frame in enumerate(frames):
        rows = image_processor(images=[frame], size=bounds, return_tensors="pt")["pixel_values"]
        group = video.groups[k // 2].pixel_values
        slot = k % 2
        ours = group.view(group.shape[0], 3, 2, -1)[:, :, slot]
        assert torch.equal(ours, rows.view(rows.shape[0], 3, 2, -1)[:, :, 0]), k


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
