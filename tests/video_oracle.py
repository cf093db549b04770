"""The video oracle: what transformers feeds its Qwen models for a clip, computed with
transformers' own code wherever that code runs without torchvision.

Transformers' video processors resize with torchvision, which cannot be installed here. So:
  - frames and their metadata: transformers' ``load_video(backend="pyav")``, with the family's
    own ``sample_frames`` as the sampler (Qwen3-VL's imports as it is; Qwen2-VL's module is
    imported with a stand-in for torchvision's functional module, which sample_frames never uses);
  - each frame's size: the family's own ``smart_resize`` (the image rule for Qwen2-VL with the
    video bounds; the video module's whole-clip rule for Qwen3-VL);
  - each frame resized, rescaled and normalized by the image processor's own methods (the PIL
    backend's resize is PIL's bicubic, as in an image request);
  - the clip's rows by the video processor's own ``patchify`` (Qwen3-VL's, the same code as
    Qwen2-VL's), its placeholder text by the processor's own timestamps and layout.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image


def qwen2_vl_video_processor_class():
    """transformers' Qwen2VLVideoProcessor, imported with torchvision's functional module stood in
    (the module imports it for resizing; sampling and the class defaults never touch it)."""
    from transformers.utils import is_torchvision_available

    name = "transformers.models.qwen2_vl.video_processing_qwen2_vl"
    if name in sys.modules:
        return sys.modules[name].Qwen2VLVideoProcessor
    # Settled (and cached) as absent first, so nothing takes the stand-in for the real package.
    assert not is_torchvision_available()
    stubs = {}
    for n in ("torchvision", "torchvision.transforms", "torchvision.transforms.v2", "torchvision.transforms.v2.functional"):
        stubs[n] = types.ModuleType(n)
        stubs[n].__spec__ = importlib.machinery.ModuleSpec(n, None)
    stubs["torchvision.transforms.v2"].functional = stubs["torchvision.transforms.v2.functional"]
    saved = {n: sys.modules.get(n) for n in stubs}
    sys.modules.update(stubs)
    try:
        return importlib.import_module(name).Qwen2VLVideoProcessor
    finally:
        for n, module in saved.items():
            if module is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = module


def hf_video_processor(model_type: str, model_dir: Path | None = None, **kwargs):
    """The family's transformers video processor class, built from its defaults and ``kwargs``
    (with ``model_dir``: from the checkpoint, as AutoVideoProcessor would)."""
    if model_type == "qwen3_vl":
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor as cls
    else:
        cls = qwen2_vl_video_processor_class()
    if model_dir is not None:
        return cls.from_pretrained(str(model_dir), **kwargs)
    return cls(**kwargs)


@dataclass(slots=True)
class OracleVideo:
    pixel_values_videos: torch.Tensor
    video_grid_thw: tuple[int, int, int]
    indices: list[int]
    fps: float
    num_frames: int
    placeholder: str  # what the template's <|video_pad|> becomes

    @property
    def sampled_fps(self) -> float:
        return len(self.indices) / self.num_frames * self.fps


def oracle_video(data: bytes, model_type: str, model_dir: Path, image_processor, *, fps: float = 2.0) -> OracleVideo:
    """One clip as transformers' Qwen model takes it (see the module's header)."""
    from transformers.image_processing_backends import PilBackend
    from transformers.image_utils import SizeDict
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_utils import load_video

    hf = hf_video_processor(model_type, model_dir)
    with tempfile.NamedTemporaryFile(suffix=".mp4") as f:
        f.write(data)
        f.flush()
        frames, metadata = load_video(f.name, backend="pyav", sample_indices_fn=lambda metadata, **_: hf.sample_frames(metadata, fps=fps))
    height, width = _target_size(hf, model_type, frames)
    normalized = []
    for frame in frames:
        array = np.asarray(Image.fromarray(frame)).transpose(2, 0, 1)  # (C, H, W) uint8, as the PIL backend holds it
        # The backend's resize to a given size (the processor's own override first picks the size).
        array = PilBackend.resize(image_processor, array, size=SizeDict(height=height, width=width), resample=image_processor.resample)
        array = image_processor.rescale(array, hf.rescale_factor)
        normalized.append(image_processor.normalize(array, hf.image_mean, hf.image_std))
    video = torch.from_numpy(np.stack(normalized)).unsqueeze(0)
    patches, grid_t, grid_h, grid_w = Qwen3VLVideoProcessor.patchify(
        None, video, patch_size=hf.patch_size, merge_size=hf.merge_size, temporal_patch_size=hf.temporal_patch_size
    )
    indices = [int(i) for i in metadata.frames_indices]
    per_group = grid_h * grid_w // hf.merge_size**2
    if model_type == "qwen3_vl":
        from transformers import Qwen3VLProcessor

        stamps = Qwen3VLProcessor._calculate_timestamps(None, list(indices), metadata.fps, hf.temporal_patch_size)
        placeholder = "".join(f"<{t:.1f} seconds><|vision_start|>" + "<|video_pad|>" * per_group + "<|vision_end|>" for t in stamps)
    else:
        placeholder = "<|video_pad|>" * (per_group * grid_t)
    return OracleVideo(patches[0], (grid_t, grid_h, grid_w), indices, float(metadata.fps), int(metadata.total_num_frames), placeholder)


def _target_size(hf, model_type: str, frames: np.ndarray) -> tuple[int, int]:
    factor = hf.patch_size * hf.merge_size
    height, width = frames.shape[1:3]
    if model_type == "qwen3_vl":
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

        return smart_resize(
            len(frames), height, width, temporal_factor=hf.temporal_patch_size, factor=factor,
            min_pixels=hf.size.shortest_edge, max_pixels=hf.size.longest_edge,
        )  # fmt: skip
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    return smart_resize(height, width, factor=factor, min_pixels=hf.size.shortest_edge, max_pixels=hf.size.longest_edge)


def oracle_case_tokens(oracle, case, max_new_tokens: int = 16, *, fps: float = 2.0):
    """transformers' greedy generate for a chat case with videos (and images): the template's
    text with each ``<|video_pad|>`` expanded as the processor expands it, the images through the
    oracle's processor, each clip through ``oracle_video``."""
    from tests.oracle import OracleOutput

    text = oracle.chat_text(case.oracle_messages)
    clips = [oracle_video(data, oracle.model_type, oracle.model_dir, oracle.image_processor, fps=fps) for data in case.videos]
    marker = "<|video_pad|>"
    pieces = text.split(marker)
    assert len(pieces) == len(clips) + 1
    text = pieces[0] + "".join(clip.placeholder + piece for clip, piece in zip(clips, pieces[1:]))
    images = oracle.image_processor(images=case.images, return_tensors="pt") if case.images else None
    if images is not None:  # each <|image_pad|> as the processor expands it
        merge = oracle.image_processor.merge_size**2
        pieces = text.split("<|image_pad|>")
        counts = [int(grid.prod()) // merge for grid in images["image_grid_thw"]]
        text = pieces[0] + "".join("<|image_pad|>" * n + piece for n, piece in zip(counts, pieces[1:]))
    ids = oracle.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    config = oracle.model.config
    token_types = torch.zeros_like(ids)
    token_types[ids == config.image_token_id] = 1
    token_types[ids == config.video_token_id] = 2
    kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "mm_token_type_ids": token_types}
    if images is not None:
        kwargs.update(pixel_values=images["pixel_values"], image_grid_thw=images["image_grid_thw"])
    if clips:
        kwargs["pixel_values_videos"] = torch.cat([clip.pixel_values_videos for clip in clips])
        kwargs["video_grid_thw"] = torch.tensor([clip.video_grid_thw for clip in clips])
        if oracle.model_type == "qwen2_5_vl":
            kwargs["second_per_grid_ts"] = torch.tensor([oracle.image_processor.temporal_patch_size / c.sampled_fps for c in clips])
    with torch.inference_mode():
        out = oracle.model.generate(
            **kwargs, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False,
            output_logits=True, return_dict_in_generate=True,
        )  # fmt: skip
    return OracleOutput(out.sequences[0, ids.shape[1] :].tolist(), [step[0].float() for step in out.logits])
